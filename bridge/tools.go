package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/shoalfabric/shoal/schemas"
)

// tool is one MCP tool: its arguments are the embedded request schema
// named by schema, unmarshalled straight into the request type run takes.
type tool struct {
	name   string
	desc   string
	failed string // how a failure reads: "Error <failed>: <message>"
	schema string // schemas/jsonschema/control/<schema>.json
	// The hints MCP clients read: a tool that only reads, one that
	// destroys (close), one a retry with the same request_id repeats
	// without acting twice.
	readOnly, destructive, idempotent bool
	run                               func(ctx context.Context, args json.RawMessage) (any, error)
}

// call adapts an operation on a request type to a tool's run.
func call[Req, Rep any](op func(context.Context, Req) (Rep, error)) func(context.Context, json.RawMessage) (any, error) {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var req Req
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, fmt.Errorf("the arguments do not fit the request: %w", err)
		}
		return op(ctx, req)
	}
}

// tools are Kaimon's nine agent tools with its argument names, defaults
// and return shapes, plus agent_events and agent_nodes.
func (m *MCP) tools() []tool {
	f := m.f
	return []tool{
		{
			name: "agent_open", failed: "opening agent", schema: "open_request", idempotent: true,
			desc: "Open a headless AI coding agent in a working directory and return its id; its events stream on NATS agent.<id> " +
				"and the Kaimon bus as agent:<id>. The model selects the backend: acp:<agent>[:<model>], ollama:<tag>, vmlx:<tag>, " +
				"anything else runs the claude CLI (a Claude model may carry an effort suffix, e.g. sonnet/high).",
			run: call(f.Open),
		},
		{
			name: "agent_send", failed: "sending to agent", schema: "send_request", idempotent: true,
			desc: "Write a user turn to an agent and return at once with the turn's number; a turn sent while another runs waits for it. " +
				"Events stream on agent:<id>.",
			run: call(f.Send),
		},
		{
			name: "agent_run", failed: "running agent turn", schema: "run_request", idempotent: true,
			desc: "Send a turn and block until it ends, returning the assistant's text, the turn and how it ended. " +
				"One synchronous run per agent at a time.",
			run: call(f.Run),
		},
		{
			name: "agent_output", failed: "reading agent output", schema: "output_request", readOnly: true,
			desc: "Read an agent's output without blocking (partial while it still works): the last message of a turn, the " +
				"whole turn, or every turn. Works for agents whose node is gone, from the event stream.",
			run: call(f.Output),
		},
		{
			name: "agent_status", schema: "status_request", readOnly: true,
			desc: "An agent's status: status, model, cwd, turn, timestamps, session id, transcript and event log paths, usage, and the node it runs on.",
			run: call(func(ctx context.Context, req schemas.StatusRequest) (schemas.AgentRecord, error) {
				rec, err := f.Status(ctx, req.AgentID)
				if schemas.CodeOf(err) == schemas.CodeNotFound {
					return rec, errors.New("No such agent: " + req.AgentID)
				}
				return rec, err
			}),
		},
		{
			name: "agent_list", failed: "listing agents", schema: "list_request", readOnly: true,
			desc: "Every agent of the fabric, dead ones kept for review included, oldest first.",
			run: call(func(ctx context.Context, _ schemas.ListRequest) (schemas.ListReply, error) {
				recs, err := f.List(ctx)
				if recs == nil {
					recs = []schemas.AgentRecord{}
				}
				return schemas.ListReply{Agents: recs}, err
			}),
		},
		{
			name: "agent_set_model", failed: "setting agent model", schema: "set_model_request", idempotent: true,
			desc: "Switch an agent to another model in place, keeping its conversation: an ACP agent takes acp:<agent>:<model> of " +
				"its own agent, a local-model agent a tag of its kind. Returns whether it switched.",
			// Kaimon's reply is {"switched": bool} exactly; the reason is
			// for Shoal's own clients.
			run: call(func(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
				rep, err := f.SetModel(ctx, req)
				rep.Reason = ""
				return rep, err
			}),
		},
		{
			name: "agent_interrupt", failed: "interrupting agent", schema: "agent_request", idempotent: true,
			desc: "Cancel an agent's running turn, and the turns sent behind it; each ends with stop reason cancelled. Returns whether anything was interrupted.",
			run:  call(f.Interrupt),
		},
		{
			name: "agent_close", failed: "closing agent", schema: "agent_request", destructive: true, idempotent: true,
			desc: "Close an agent: stop its process and everything it started. It is kept as dead for review. false for an unknown id.",
			run:  call(f.Close),
		},
		{
			name: "agent_events", failed: "reading agent events", schema: "events_request", readOnly: true,
			desc: "Replay an agent's stored events (a Shoal addition): from the start, from an event number, a turn or a time, " +
				"a page at a time. next_event continues the read; gaps in the numbering are reported.",
			run: call(f.Events),
		},
		{
			name: "agent_nodes", failed: "listing nodes", schema: "nodes_request", readOnly: true,
			desc: "The nodes of the fabric and what each can run (a Shoal addition).",
			run: call(func(ctx context.Context, _ schemas.NodesRequest) (schemas.NodesReply, error) {
				nodes, err := f.Nodes(ctx)
				if nodes == nil {
					nodes = []schemas.NodeRecord{}
				}
				return schemas.NodesReply{Nodes: nodes}, err
			}),
		},
		{
			// A second answer acts on nothing: it is told who answered.
			name: "agent_permit", failed: "answering a permission request", schema: "permit_request", idempotent: true,
			desc: "Answer a permission request an agent opened with permission ask waits on (a Shoal addition): allow lets the " +
				"tool run, deny refuses it with your message. Only the first answer counts; a later one is a conflict naming it.",
			run: call(func(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
				req.By = "mcp"
				if id := callingAgent(ctx); id != "" {
					req.By = "agent " + id
				}
				return f.Permit(ctx, req)
			}),
		},
		{
			name: "agent_pending", failed: "listing permission requests", schema: "pending_request", readOnly: true,
			desc: "The permission requests agents wait on, oldest first, with each tool call's input (a Shoal addition).",
			run: call(func(ctx context.Context, _ struct{}) (schemas.PendingReply, error) {
				reqs, err := f.Pending(ctx)
				if reqs == nil {
					reqs = []schemas.PermitRecord{}
				}
				return schemas.PendingReply{Requests: reqs}, err
			}),
		},
	}
}
