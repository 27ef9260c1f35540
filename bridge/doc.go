// Package bridge connects the fabric to the outside, and holds nothing
// else: Kaimon's nine MCP tools plus agent_nodes and agent_events
// (Streamable HTTP and stdio), made from the embedded request schemas and
// served through a client.Client, and the Kaimon ZeroMQ event bus, fed
// from the JetStream stream byte for byte.
package bridge
