package bridge_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An MCP client that retries a call with the same request_id (after a
// timeout, a reconnect) gets the first reply, and nothing acts twice:
// one agent for two opens, one turn for two sends, one interrupt and one
// close. Without a request_id every call is new.
func TestMCPRetriesActOnce(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := fakebackend.New(fakebackend.Config{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	s := fb.client(nil)
	cwd := t.TempDir()

	var first, again schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": cwd, "request_id": "open-1"}, &first)
	// A second client (a reconnected one) retries.
	ok(t, fb.client(nil), "agent_open", map[string]any{"cwd": cwd, "request_id": "open-1"}, &again)
	if again != first {
		t.Fatalf("a retried open answered %+v, the first %+v", again, first)
	}
	var list schemas.ListReply
	ok(t, s, "agent_list", map[string]any{}, &list)
	if len(list.Agents) != 1 || be.Starts.Load() != 1 {
		t.Fatalf("%d agents listed, %d started after a retried open; want 1 and 1", len(list.Agents), be.Starts.Load())
	}
	id := first.AgentID

	send := func(rid string) schemas.SendReply {
		var rep schemas.SendReply
		args := map[string]any{"agent_id": id, "text": "hello"}
		if rid != "" {
			args["request_id"] = rid
		}
		ok(t, s, "agent_send", args, &rep)
		return rep
	}
	waitIdle := func() {
		poll.Until(t, 30*time.Second, "the agent idle", func() bool {
			rec, err := fb.f.Status(t.Context(), id)
			return err == nil && rec.Status == schemas.StatusIdle
		})
	}
	one := send("send-1")
	waitIdle()
	if two := send("send-1"); two != one || be.Prompts.Load() != 1 {
		t.Fatalf("a retried send answered %+v (first %+v) after %d turns; want the first reply and 1 turn", two, one, be.Prompts.Load())
	}
	// The same request id for a different request is no retry: refused as
	// a conflict that names the first, and nothing acts.
	text, isErr := call(t, s, "agent_send", map[string]any{"agent_id": id, "text": "something else", "request_id": "send-1"})
	if !isErr || !strings.Contains(text, "request id send-1 was used") || !strings.Contains(text, "another send request about agent "+id) || strings.Contains(text, "hello") || be.Prompts.Load() != 1 {
		t.Fatalf("another send under request id send-1: %q after %d turns", text, be.Prompts.Load())
	}
	// The same request id on another agent is another request.
	var other schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": cwd}, &other)
	var elsewhere schemas.SendReply
	ok(t, s, "agent_send", map[string]any{"agent_id": other.AgentID, "text": "hi", "request_id": "send-1"}, &elsewhere)
	// The send is accepted before the turn reaches the backend.
	poll.Until(t, 30*time.Second, "a request id reused for another agent acts", func() bool { return be.Prompts.Load() == 2 })
	waitIdle()
	if fresh := send(""); fresh.Turn != one.Turn+1 {
		t.Fatalf("a send without a request id is turn %d, want %d", fresh.Turn, one.Turn+1)
	}
	waitIdle()

	var ir1, ir2 schemas.InterruptReply
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": id, "request_id": "int-1"}, &ir1)
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": id, "request_id": "int-1"}, &ir2)
	if ir1 != ir2 {
		t.Errorf("a retried interrupt answered %+v, the first %+v", ir2, ir1)
	}
	var c1, c2 schemas.CloseReply
	ok(t, s, "agent_close", map[string]any{"agent_id": id, "request_id": "close-1"}, &c1)
	ok(t, s, "agent_close", map[string]any{"agent_id": id, "request_id": "close-1"}, &c2)
	if !c1.Closed || c2 != c1 || be.Closes.Load() != 1 {
		t.Errorf("close then its retry answered %+v and %+v with %d closes; want closed twice, one close", c1, c2, be.Closes.Load())
	}
}

// A retry of an interrupt or a close through the coordinator's service
// (shoal.fabric.<verb>, what a scoped client uses) keeps its request id
// on the way to the node, so it acts once too.
func TestServiceRetriesKeepTheirRequestID(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	be := fakebackend.New(fakebackend.Config{})
	fabrictest.Node(t, srv, node.Config{Name: "n1", Backends: []backend.Backend{be}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.FabricService(t, natstest.Connect(t, srv), f)

	open, err := f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, srv)
	ask := func(verb schemas.Verb, req schemas.AgentRequest) []byte {
		t.Helper()
		b, _ := json.Marshal(req)
		var m *nats.Msg
		poll.Until(t, 30*time.Second, "the fabric service answering "+string(verb), func() bool {
			m, err = nc.Request(schemas.FabricSubject(verb), b, 10*time.Second)
			return err == nil
		})
		return m.Data
	}
	// An interrupt reaches the backend only when a turn runs.
	if _, err := f.Send(t.Context(), schemas.SendRequest{AgentID: open.AgentID, Text: "stall on"}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the turn running", func() bool {
		rec, err := f.Status(t.Context(), open.AgentID)
		return err == nil && rec.Status == schemas.StatusWorking
	})
	ir := schemas.AgentRequest{AgentID: open.AgentID, RequestID: "svc-int-1"}
	if first, second := ask("interrupt", ir), ask("interrupt", ir); string(first) != string(second) || be.Interrupts.Load() != 1 {
		t.Fatalf("interrupt and its retry through the service answered %s and %s with %d interrupts; want one", first, second, be.Interrupts.Load())
	}
	req := schemas.AgentRequest{AgentID: open.AgentID, RequestID: "svc-close-1"}
	first := ask("close", req)
	second := ask("close", req)
	if string(first) != string(second) || be.Closes.Load() != 1 {
		t.Fatalf("close and its retry through the service answered %s and %s with %d closes; want one close and the first reply twice", first, second, be.Closes.Load())
	}
}
