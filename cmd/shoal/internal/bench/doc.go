// Package bench measures a Shoal fabric from outside, the way `nats bench`
// measures NATS: a stand-in claude CLI (StandinArg, a hidden subcommand of
// the shoal binary) streams timestamped text deltas through a real node
// process, the real NATS server and JetStream, and the bench reports what
// arrived where and when against raw JetStream publishes of the same
// envelopes in the same run. It also checks that every agent's stream is
// gapless and every turn ended.
package bench
