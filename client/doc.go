// Package client drives and watches the fabric. One Client interface has
// two implementations: Direct reads the stream and the buckets and asks
// the nodes itself (full credentials, the coordinator's own services);
// Remote sends every request to the coordinator's fabric service (scoped
// credentials). The command line, the TUI, the MCP tools and the fabric
// service all use one, so every surface answers alike: one output path
// from the stream, one replay, one placement of new agents.
package client
