// Package metrics exports what Shoal's parts count to Prometheus, served
// at /metrics by `shoal up --metrics` and `shoal node --metrics`. It is
// the only user of client_golang: the node, the coordinator and the
// bridge report through their own small interfaces (node.Metrics,
// coordinator.RelayMetrics and ServiceMetrics, bridge.MCPMetrics), which
// the types here satisfy, and the binary wires them together.
//
// Per node, labelled node="<name>":
//
//	shoal_agents{status}                    gauge: the agents the node keeps, dead ones kept for review included
//	shoal_turns_started_total               counter: turns the node began
//	shoal_turns_ended_total{stop_reason}    counter: turns' results
//	shoal_events_published_total            counter: events the stream stored
//	shoal_event_publish_latency_seconds     histogram: from an event's production to the stream's acknowledgement
//	shoal_outbox_events                     gauge: events waiting to be stored (in flight, in memory, on disk)
//	shoal_node_request_errors_total{verb,code}  counter: error replies of the node's control service
//
// Per coordinator:
//
//	shoal_fabric_agents{status}             gauge: the fabric's agent records, by status
//	shoal_relay_refusals_total{op}          counter: confined nodes' writes the relay refused
//	shoal_mcp_calls_total{tool,outcome}     counter: MCP tool calls; outcome ok, invalid, refused or error
//	shoal_fabric_request_errors_total{verb,code}  counter: error replies of the fabric service
//
// The Go runtime's and the process's own metrics (go_*, process_*) are
// there too.
package metrics
