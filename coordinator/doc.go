// Package coordinator holds the coordinator's own services, each made by
// New…(Config), run by Run(ctx) until its context ends, ready when Ready()
// is closed: the relay through which confined nodes (scoped credentials)
// write their events and records, the monitor that marks a lost node's
// agents dead, and the fabric service through which scoped clients reach
// everything else.
package coordinator
