// Package bridge connects the fabric to the outside: Kaimon's nine MCP
// tools (Streamable HTTP and stdio), the Kaimon ZeroMQ event bus fed from
// JetStream, and placement of new agents on nodes.
package bridge
