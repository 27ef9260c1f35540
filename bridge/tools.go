package bridge

import (
	"context"
	"errors"

	"github.com/shoalfabric/shoal/schemas"
)

var (
	agentIDParam = param{name: "agent_id", kind: "string", required: true, desc: "The agent's id, as agent_open returned it."}
	presetWords  = []string{"default", "notebook", "specialist", "lab", "auto", "bypass"}
	requestParam = param{name: "request_id", kind: "string", desc: "An id of your choosing for this call (a Shoal addition): " +
		"a retry that carries the same id within two minutes gets the first reply and does not act twice."}
)

// tools are Kaimon's nine agent tools with its argument names, defaults
// and return shapes, plus agent_nodes.
func (m *MCP) tools() []tool {
	f := m.f
	return []tool{
		{
			name:   "agent_open",
			failed: "opening agent",
			desc: "Open a headless AI coding agent in a working directory and return its id; its events stream on NATS agent.<id> " +
				"and the Kaimon bus as agent:<id>. The model selects the backend: acp:<agent>[:<model>], ollama:<tag>, vmlx:<tag>, " +
				"anything else runs the claude CLI (a Claude model may carry an effort suffix, e.g. sonnet/high).",
			params: []param{
				{name: "cwd", kind: "string", required: true, desc: "Working directory for the agent, on the node that runs it. Must exist."},
				{name: "model", kind: "string", desc: "Model alias or id (default sonnet), with an optional backend prefix."},
				{name: "effort", kind: "string", desc: "Claude thinking effort: low, medium or high. Overrides a model suffix."},
				{name: "permission", kind: "string", enum: presetWords, desc: "Permission preset (default: default)."},
				{name: "permission_mode", kind: "string", desc: "Override the preset's claude permission mode: default, acceptEdits, plan, auto, bypassPermissions."},
				{name: "allowed_tools", kind: "string[]", desc: "Extra tool allowlist; composes with the preset."},
				{name: "only", kind: "boolean", desc: "Make allowed_tools the agent's whole tool set (claude agents)."},
				{name: "disallowed_tools", kind: "string[]", desc: "Tools the agent may not call. Defaults to the recursion guard; [] allows nested agents."},
				{name: "mcp_config", kind: "string", desc: "Path to an extra --mcp-config JSON for a claude agent."},
				{name: "system_prompt", kind: "string", desc: "Instructions appended to the agent's system prompt."},
				{name: "id", kind: "string", desc: "Caller-chosen agent id; reopening a dead id reuses it."},
				{name: "node", kind: "string", desc: "The node to run on (a Shoal addition)."},
				{name: "labels", kind: "map", desc: "Labels the node must carry, e.g. {\"gpu\": \"yes\"} (a Shoal addition)."},
				requestParam,
			},
			run: func(ctx context.Context, a args) (any, error) {
				req := schemas.OpenRequest{
					CWD: a.str("cwd"), Model: a.str("model"), Effort: a.str("effort"),
					Permission: a.str("permission"), PermissionMode: a.str("permission_mode"),
					AllowedTools: a.strings("allowed_tools"), Only: a.boolean("only"),
					MCPConfig: a.str("mcp_config"), SystemPrompt: a.str("system_prompt"),
					ID: a.str("id"), Node: a.str("node"), RequestID: a.str("request_id"),
				}
				if a.has("disallowed_tools") {
					d := a.strings("disallowed_tools")
					req.DisallowedTools = &d
				}
				if l, ok := a["labels"].(map[string]any); ok {
					req.Labels = map[string]string{}
					for k, v := range l {
						req.Labels[k] = v.(string)
					}
				}
				return f.Open(ctx, req)
			},
		},
		{
			name:   "agent_send",
			failed: "sending to agent",
			desc:   "Write a user turn to an agent and return at once with the turn's number; events stream on agent:<id>.",
			params: []param{agentIDParam, {name: "text", kind: "string", required: true, desc: "The user's message."}, requestParam},
			run: func(ctx context.Context, a args) (any, error) {
				return f.Send(ctx, schemas.SendRequest{AgentID: a.str("agent_id"), Text: a.str("text"), RequestID: a.str("request_id")})
			},
		},
		{
			name:   "agent_run",
			failed: "running agent turn",
			desc:   "Send a turn and block until it ends, returning the assistant's text. One synchronous run per agent at a time.",
			params: []param{agentIDParam,
				{name: "text", kind: "string", required: true, desc: "The user's message."},
				{name: "timeout", kind: "number", desc: "Seconds to wait (default 600)."}, requestParam},
			run: func(ctx context.Context, a args) (any, error) {
				if a.has("timeout") && a.num("timeout") <= 0 {
					return nil, errors.New("timeout must be positive")
				}
				return f.Run(ctx, schemas.RunRequest{AgentID: a.str("agent_id"), Text: a.str("text"), Timeout: a.num("timeout"), RequestID: a.str("request_id")})
			},
		},
		{
			name:   "agent_output",
			failed: "reading agent output",
			desc: "Read an agent's output without blocking (partial while it still works): the last message of a turn, the " +
				"whole turn, or every turn. Works for agents whose node is gone, from the event stream.",
			params: []param{agentIDParam,
				{name: "turn", kind: "integer", desc: "The turn to read (default: the latest)."},
				{name: "which", kind: "string", enum: []string{"last_message", "full_turn", "all"}, desc: "What to return (default last_message)."},
				{name: "include_tools", kind: "boolean", desc: "Interleave a line per tool call and result (default false)."},
				{name: "max_chars", kind: "integer", desc: "Return at most this many characters (default 20000)."}},
			run: func(ctx context.Context, a args) (any, error) {
				req := schemas.OutputRequest{AgentID: a.str("agent_id"), Which: a.str("which"), IncludeTools: a.boolean("include_tools")}
				if a.has("turn") {
					t := int(a.num("turn"))
					req.Turn = &t
				}
				if a.has("max_chars") {
					n := int(a.num("max_chars"))
					req.MaxChars = &n
				}
				return f.Output(ctx, req)
			},
		},
		{
			name:   "agent_status",
			desc:   "An agent's status: status, model, cwd, turn, timestamps, session id, transcript and event log paths, usage, and the node it runs on.",
			params: []param{agentIDParam},
			run: func(ctx context.Context, a args) (any, error) {
				rec, err := f.Status(ctx, a.str("agent_id"))
				if schemas.CodeOf(err) == schemas.CodeNotFound {
					return nil, errors.New("No such agent: " + a.str("agent_id"))
				}
				return rec, err
			},
		},
		{
			name:   "agent_set_model",
			failed: "setting agent model",
			desc:   "Repoint a live agent at another model, keeping its conversation. ACP and local-model (ollama:, vmlx:) agents only; false everywhere else.",
			params: []param{agentIDParam, {name: "model", kind: "string", required: true, desc: "The full model string, e.g. acp:opencode:opencode/glm-5.3-flash."}},
			run: func(ctx context.Context, a args) (any, error) {
				return f.SetModel(ctx, schemas.SetModelRequest{AgentID: a.str("agent_id"), Model: a.str("model")})
			},
		},
		{
			name:   "agent_list",
			failed: "listing agents",
			desc:   "Every agent of the fabric, dead ones kept for review included, with the node each runs on.",
			run: func(ctx context.Context, _ args) (any, error) {
				recs, err := f.List(ctx)
				return schemas.ListReply{Agents: recs}, err
			},
		},
		{
			name:   "agent_interrupt",
			failed: "interrupting agent",
			desc:   "Cancel an agent's running turn; it ends with stop reason cancelled. Returns whether a turn was interrupted.",
			params: []param{agentIDParam, requestParam},
			run: func(ctx context.Context, a args) (any, error) {
				return f.Interrupt(ctx, schemas.AgentRequest{AgentID: a.str("agent_id"), RequestID: a.str("request_id")})
			},
		},
		{
			name:   "agent_close",
			failed: "closing agent",
			desc:   "Close an agent: stop its process and everything it started. It is kept as dead for review. false for an unknown id.",
			params: []param{agentIDParam, requestParam},
			run: func(ctx context.Context, a args) (any, error) {
				return f.Close(ctx, schemas.AgentRequest{AgentID: a.str("agent_id"), RequestID: a.str("request_id")})
			},
		},
		{
			name:   "agent_events",
			failed: "reading agent events",
			desc: "Replay an agent's stored events (a Shoal addition): from the start, from an event number, a turn or a time, " +
				"a page at a time. next_event continues the read; gaps in the numbering are reported.",
			params: []param{agentIDParam,
				{name: "from_event", kind: "integer", desc: "Start at this event number (1 is the first)."},
				{name: "from_turn", kind: "integer", desc: "Start where this turn began."},
				{name: "since", kind: "string", desc: "Start at the first event stored at or after this RFC 3339 time."},
				{name: "max", kind: "integer", desc: "Return at most this many events (default 200, at most 5000)."},
				{name: "include_deltas", kind: "boolean", desc: "Keep the streamed chunks (default false: the authoritative copies follow them)."}},
			run: func(ctx context.Context, a args) (any, error) {
				if a.num("from_event") < 0 {
					return nil, errors.New("from_event must be positive")
				}
				return f.Events(ctx, schemas.EventsRequest{AgentID: a.str("agent_id"), FromEvent: uint64(a.num("from_event")),
					FromTurn: int(a.num("from_turn")), Since: a.str("since"), Max: int(a.num("max")), IncludeDeltas: a.boolean("include_deltas")})
			},
		},
		{
			name:   "agent_nodes",
			failed: "listing nodes",
			desc:   "The nodes of the fabric and what each can run (a Shoal addition).",
			run: func(ctx context.Context, _ args) (any, error) {
				nodes, err := f.Nodes(ctx)
				if nodes == nil {
					nodes = []schemas.NodeRecord{}
				}
				return map[string]any{"nodes": nodes}, err
			},
		},
	}
}
