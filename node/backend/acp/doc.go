// Package acp runs agents that speak the Agent Client Protocol over stdio:
// opencode (`opencode acp`), Claude through claude-agent-acp, and gemini
// (`gemini --acp`). A model string acp:<agent>[:<model>] picks the agent
// and, optionally, its model.
//
// The node is the ACP client. It answers the agent's permission requests
// by the agent's preset (a durable permission event first, then allow or
// refuse; headless never waits), serves fs/read_text_file and
// fs/write_text_file confined to the agent's directory, and maps the
// session/update stream onto Shoal's events, replaying the streamed text
// as authoritative events when a turn ends. Notifications are read off the
// agent's stdout by the node itself, in wire order, so a burst of updates
// can never overflow the protocol library's queue and a line that is not
// JSON becomes an error event instead of a dead connection.
//
// opencode gets a per-agent configuration directory with the user's
// provider block, the model, and a plugin that asks the node, over
// loopback, before any of opencode's own tools runs, so presets bind
// opencode's tools that never ask permission.
package acp
