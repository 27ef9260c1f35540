// Package bridge connects the fabric to the outside, and holds nothing
// else: thirteen MCP tools (Kaimon's nine, plus agent_nodes, agent_events,
// agent_pending and agent_permit) over Streamable HTTP and stdio, made
// from the embedded request schemas, checked against them, judged by the
// rights rules at the door and served through a client.Client; the
// Kaimon ZeroMQ event bus, fed from the JetStream stream byte for byte;
// and, in bridge/web, the dashboard beside the MCP endpoint.
package bridge
