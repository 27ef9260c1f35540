package bridge_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A local model (the Ollama dialect) under permission ask calls an MCP
// tool: the node holds the call, agent_pending lists it with its input,
// agent_permit allows it, the tool runs and the turn ends with its
// result; a second answer is a conflict.
func TestLocalModelAsksOverMCP(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{ollamaBackend(t, fake)}})
	s := fb.client(nil)
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "agent_nodes", Input: json.RawMessage(`{}`)}}},
		fakemodel.Reply{Text: "Looked at the nodes."},
	)
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "asker", "model": "ollama:fake-model", "permission": "ask"}, &opened)
	var sent schemas.SendReply
	ok(t, s, "agent_send", map[string]any{"agent_id": "asker", "text": "Look at the nodes."}, &sent)

	pending := waitPending(t, s)
	req := pending.Requests[0]
	if req.AgentID != "asker" || req.Tool != "agent_nodes" || req.Node != "n1" {
		t.Fatalf("the request: %+v", req)
	}
	var permitted schemas.PermitReply
	ok(t, s, "agent_permit", map[string]any{"agent_id": "asker", "request_id": req.RequestID, "decision": "allow"}, &permitted)
	if a := permitted.Record.Answer; a == nil || a.Decision != schemas.DecisionAllow || a.By != "mcp" {
		t.Fatalf("the answer: %+v", permitted.Record)
	}
	if text, isErr := call(t, s, "agent_permit", map[string]any{"agent_id": "asker", "request_id": req.RequestID, "decision": "deny"}); !isErr || !strings.Contains(text, "already answered: allow by mcp") {
		t.Errorf("a second answer: %q (error %v)", text, isErr)
	}
	var out schemas.OutputReply
	deadline := time.Now().Add(30 * time.Second)
	for ok(t, s, "agent_output", map[string]any{"agent_id": "asker"}, &out); out.Text != "Looked at the nodes."; ok(t, s, "agent_output", map[string]any{"agent_id": "asker"}, &out) {
		if time.Now().After(deadline) {
			t.Fatalf("the turn did not end: %+v", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	reqs := fake.Requests()
	if r := reqs[len(reqs)-1].ToolResults; len(r) != 1 || r[0].IsError || !strings.Contains(r[0].Content, `"n1"`) {
		t.Errorf("the allowed tool's result: %+v", r)
	}
}

// An interrupt while a local model's tool call waits on a person ends
// the turn there: the node cancels the turn before it answers the waiting
// request, so the model's next tool call of the same answer is never
// begun. Before, the request was denied first, and the turn, not yet
// cancelled, began the next call and asked a person of it (a tool_use
// and a permission request after the interrupt, withdrawn a moment
// later).
func TestAnInterruptBeginsNoToolCallOfALocalModel(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{ollamaBackend(t, fake)}})
	s := fb.client(nil)
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{
		{Name: "agent_nodes", Input: json.RawMessage(`{}`)},
		{Name: "agent_pending", Input: json.RawMessage(`{}`)},
	}})
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "halted", "model": "ollama:fake-model", "permission": "ask"}, &opened)
	var sent schemas.SendReply
	ok(t, s, "agent_send", map[string]any{"agent_id": "halted", "text": "Look twice."}, &sent)
	waitPending(t, s)
	var interrupted schemas.InterruptReply
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": "halted"}, &interrupted)
	var kinds []string
	asked := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var evs schemas.EventsReply
		ok(t, s, "agent_events", map[string]any{"agent_id": "halted", "from_turn": 1}, &evs)
		kinds = kinds[:0]
		for _, e := range evs.Events {
			var k struct {
				Kind string `json:"kind"`
				Data struct {
					RequestID string `json:"requestId"`
				} `json:"data"`
			}
			json.Unmarshal(e.Event, &k)
			kinds = append(kinds, k.Kind)
			if k.Kind == "permission" {
				asked[k.Data.RequestID] = true
			}
		}
		if len(kinds) > 0 && kinds[len(kinds)-1] == "result" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted turn did not end: %v", kinds)
		}
		time.Sleep(50 * time.Millisecond)
	}
	count := func(kind string) (n int) {
		for _, k := range kinds {
			if k == kind {
				n++
			}
		}
		return n
	}
	if count("tool_use") != 1 || len(asked) != 1 {
		t.Errorf("the interrupted turn's events: %v, requests %v; want the one tool call asked of before the interrupt, and no other", kinds, asked)
	}
}

// waitPending waits for a permission request to be listed, and returns
// the list.
func waitPending(t *testing.T, s *mcp.ClientSession) schemas.PendingReply {
	t.Helper()
	var pending schemas.PendingReply
	deadline := time.Now().Add(30 * time.Second)
	for ok(t, s, "agent_pending", nil, &pending); len(pending.Requests) == 0; ok(t, s, "agent_pending", nil, &pending) {
		if time.Now().After(deadline) {
			t.Fatal("no permission request is pending")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return pending
}
