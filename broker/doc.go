// Package broker runs Shoal's embedded NATS server with JetStream and
// provisions what the fabric stores in it: the AGENTS stream of agent
// events and the shoal_agents and shoal_nodes KV buckets.
//
// A coordinator embeds one Broker (New, Start, Shutdown); a deployment
// that already runs NATS skips the server and calls Provision against it.
// Provisioning is idempotent: restarting on an existing store keeps every
// message, and changed limits are applied to the existing stream.
package broker
