// Package node is Shoal's agent host: it owns the agent sessions of one
// machine, supervises their processes, publishes their events onto
// agent.<id> and answers the control requests addressed to it as the NATS
// micro service shoal-node.
package node
