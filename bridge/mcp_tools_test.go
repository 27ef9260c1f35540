package bridge_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/schemas"
)

// ollamaBackend runs local-model agents against a fake Ollama server.
func ollamaBackend(t *testing.T, fake *fakemodel.Server) backend.Backend {
	t.Helper()
	b, err := local.New(local.Config{Kind: backend.BackendOllama, Host: fake.URL()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeKeys decodes a tool's JSON reply as a generic object.
func decodeKeys(t *testing.T, text string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("reply %q: %v", text, err)
	}
	return m
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

// agent_open's node and labels place an agent over MCP, and agent_nodes
// says what each node can run: its labels and its backends, with the
// claude CLI's path and version and the models the Ollama server offers.
// Both nodes run claude, so only the node or labels asked for decide
// where a claude agent goes.
func TestMCPOpenByNodeAndLabels(t *testing.T) {
	t.Parallel()
	fakeClaude := fakemodel.Start(t, fakemodel.Config{})
	fakeOllama := fakemodel.Start(t, fakemodel.Config{Models: []string{"fake-model", "other-model:7b"}})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Labels: map[string]string{"site": "lab"}, Backends: []backend.Backend{fb.claudeBackend(fakeClaude)}})
	fb.runNode(node.Config{Name: "n2", Labels: map[string]string{"site": "lab", "gpu": "yes"},
		Backends: []backend.Backend{fb.claudeBackend(fakeClaude), ollamaBackend(t, fakeOllama)}})
	s := fb.client(nil)

	// agent_nodes, read generically: {"nodes": [...]}, each node with its
	// labels and backends.
	text, isErr := call(t, s, "agent_nodes", nil)
	if isErr {
		t.Fatalf("agent_nodes: %s", text)
	}
	reply := decodeKeys(t, text)
	if keys := sortedKeys(reply); !slices.Equal(keys, []string{"nodes"}) {
		t.Errorf("agent_nodes reply keys %v", keys)
	}
	nodes, _ := reply["nodes"].([]any)
	if len(nodes) != 2 {
		t.Fatalf("agent_nodes: %s", text)
	}
	byName := map[string]map[string]any{}
	for _, n := range nodes {
		m, _ := n.(map[string]any)
		name, _ := m["name"].(string)
		byName[name] = m
		for _, k := range []string{"name", "labels", "backends", "agents", "max_agents", "host", "heartbeat"} {
			if _, ok := m[k]; !ok {
				t.Errorf("node %s lacks %q: %s", name, k, mustJSON(m))
			}
		}
	}
	var listed struct {
		Nodes []schemas.NodeRecord `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(text), &listed); err != nil {
		t.Fatal(err)
	}
	n1, n2 := listed.Nodes[0], listed.Nodes[1]
	if n1.Name != "n1" || n2.Name != "n2" {
		t.Fatalf("agent_nodes names: %s, %s", n1.Name, n2.Name)
	}
	if !maps.Equal(n1.Labels, map[string]string{"site": "lab"}) || !maps.Equal(n2.Labels, map[string]string{"site": "lab", "gpu": "yes"}) {
		t.Errorf("labels: n1 %v, n2 %v", n1.Labels, n2.Labels)
	}
	claudePath := peers.Claude.Command(t)[0]
	if len(n1.Backends) != 1 || n1.Backends[0].Kind != backend.BackendClaude || n1.Backends[0].Path != claudePath ||
		n1.Backends[0].Version == "" || !n1.Backends[0].Ready {
		t.Errorf("n1 can run: %s; want the claude CLI at %s with its version", mustJSON(n1.Backends), claudePath)
	}
	if len(n2.Backends) != 2 || n2.Backends[0].Kind != backend.BackendClaude || n2.Backends[0].Version != n1.Backends[0].Version ||
		n2.Backends[1].Kind != backend.BackendOllama || n2.Backends[1].Host != fakeOllama.URL() ||
		!slices.Equal(n2.Backends[1].Models, []string{"fake-model", "other-model:7b"}) || !n2.Backends[1].Ready {
		t.Errorf("n2 can run: %s; want claude, and Ollama at %s with fake-model and other-model:7b", mustJSON(n2.Backends), fakeOllama.URL())
	}
	if b, _ := byName["n2"]["backends"].([]any); len(b) == 2 {
		if got := b[1].(map[string]any)["models"]; mustJSON(got) != `["fake-model","other-model:7b"]` {
			t.Errorf("n2's models on the wire: %s", mustJSON(got))
		}
	}

	// Placement by node name and by labels. Left to itself, placement
	// would put the first claude agent on n1 (both idle, n1 first by
	// name) and the second on n1 too (n2 then runs one).
	opens := []struct {
		args     map[string]any
		wantNode string
	}{
		{map[string]any{"id": "by-name", "node": "n2"}, "n2"},
		{map[string]any{"id": "by-label", "labels": map[string]any{"gpu": "yes"}}, "n2"},
		{map[string]any{"id": "by-model", "model": "ollama:other-model:7b", "labels": map[string]any{"site": "lab"}}, "n2"},
	}
	for _, o := range opens {
		o.args["cwd"] = t.TempDir()
		var rep schemas.OpenReply
		ok(t, s, "agent_open", o.args, &rep)
		if rep.AgentID != o.args["id"] || rep.Node != o.wantNode {
			t.Errorf("agent_open %v: %+v, want node %s", o.args, rep, o.wantNode)
		}
		var rec schemas.AgentRecord
		ok(t, s, "agent_status", map[string]any{"agent_id": rep.AgentID}, &rec)
		if rec.Node != o.wantNode || rec.Status != schemas.StatusIdle {
			t.Errorf("agent_status of %s: node %s status %s", rep.AgentID, rec.Node, rec.Status)
		}
	}
	// What cannot be placed says why, node by node.
	refusals := []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"labels": map[string]any{"gpu": "no"}}, "Error opening agent: no node can take this agent (n1: lacks label gpu=no; n2: has gpu=yes, not no)"},
		{map[string]any{"model": "ollama:fake-model", "labels": map[string]any{"site": "home"}}, "Error opening agent: no node can take this agent (n1: cannot run ollama agents: it has none; n2: has site=lab, not home)"},
		{map[string]any{"model": "ollama:absent"}, `Error opening agent: no node can take this agent (n1: cannot run ollama agents: it has none; n2: does not serve ollama model "absent")`},
		{map[string]any{"model": "ollama:fake-model", "node": "n1"}, "Error opening agent: node n1 cannot take this agent: cannot run ollama agents: it has none"},
		{map[string]any{"node": "n3"}, "Error opening agent: no node named n3 is running (nodes: n1, n2)"},
	}
	for _, r := range refusals {
		r.args["cwd"] = t.TempDir()
		if text, isErr := call(t, s, "agent_open", r.args); !isErr || text != r.want {
			t.Errorf("agent_open %v:\n got %q\nwant %q", r.args, text, r.want)
		}
	}
	// agent_nodes counts the agents each node runs.
	poll.Until(t, 30*time.Second, "agent_nodes to count n1's no agent and n2's three", func() bool {
		ok(t, s, "agent_nodes", nil, &listed)
		return len(listed.Nodes) == 2 && listed.Nodes[0].Agents == 0 && listed.Nodes[1].Agents == 3
	})
	// A claude agent cannot switch models (Kaimon: false everywhere but
	// ACP and local models).
	if text, isErr := call(t, s, "agent_set_model", map[string]any{"agent_id": "by-name", "model": "opus"}); isErr || text != `{"switched":false}` {
		t.Errorf("agent_set_model of a claude agent: %q", text)
	}
}

// kaimonOutputKeys are agent_output's reply keys (Kaimon §3); usage is
// present only for a live session.
var kaimonOutputKeys = []string{"agent_id", "done", "dropped_chars", "status", "text", "truncated", "turn", "which"}

// agent_output reads turns from the stream once the agent's node is gone:
// full_turn with and without include_tools, all, and max_chars counted in
// characters, with Kaimon's reply keys.
func TestMCPOutputAfterNodeGone(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	stop := fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{ollamaBackend(t, fake)}})
	s := fb.client(nil)
	const answer = "Ünïcödé answer: one agent — done."
	fake.Script(
		fakemodel.Reply{Text: "Let me look.", ToolCalls: []fakemodel.ToolCall{{Name: "agent_nodes", Input: json.RawMessage(`{}`)}}},
		fakemodel.Reply{Text: answer},
		fakemodel.Reply{Text: "Second turn."},
	)
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "out-1", "model": "ollama:fake-model"}, &opened)
	var ran schemas.RunReply
	ok(t, s, "agent_run", map[string]any{"agent_id": "out-1", "text": "Look, then answer.", "timeout": 60}, &ran)
	if ran.Text != "Let me look.\n"+answer {
		t.Errorf("agent_run turn 1: %q", ran.Text)
	}
	ok(t, s, "agent_run", map[string]any{"agent_id": "out-1", "text": "Again.", "timeout": 60}, &ran)

	// While the agent lives, the reply carries its usage too.
	text, _ := call(t, s, "agent_output", map[string]any{"agent_id": "out-1", "turn": 1})
	live := decodeKeys(t, text)
	if keys := sortedKeys(live); !slices.Equal(keys, slices.Sorted(slices.Values(append(slices.Clone(kaimonOutputKeys), "usage")))) {
		t.Errorf("agent_output keys of a live agent: %v", keys)
	}

	stop()
	fullWithTools := "Let me look.\n\n→ tool: agent_nodes (other)\n\n← result: completed\n\n" + answer
	chars := utf8.RuneCountInString
	cases := []struct {
		name string
		args map[string]any
		want map[string]any
	}{
		{"full_turn with tools", map[string]any{"turn": 1, "which": "full_turn", "include_tools": true},
			map[string]any{"turn": 1, "which": "full_turn", "text": fullWithTools, "truncated": false, "dropped_chars": 0}},
		{"full_turn", map[string]any{"turn": 1, "which": "full_turn"},
			map[string]any{"turn": 1, "which": "full_turn", "text": "Let me look.\n\n" + answer, "truncated": false, "dropped_chars": 0}},
		{"last_message", map[string]any{"turn": 1},
			map[string]any{"turn": 1, "which": "last_message", "text": answer, "truncated": false, "dropped_chars": 0}},
		{"the latest turn", map[string]any{},
			map[string]any{"turn": 2, "which": "last_message", "text": "Second turn.", "truncated": false, "dropped_chars": 0}},
		{"last_message cut", map[string]any{"turn": 1, "max_chars": 10},
			map[string]any{"turn": 1, "which": "last_message", "text": "Ünïcödé an", "truncated": true, "dropped_chars": chars(answer) - 10}},
		{"full_turn with tools cut", map[string]any{"turn": 1, "which": "full_turn", "include_tools": true, "max_chars": 30},
			map[string]any{"turn": 1, "which": "full_turn", "text": string([]rune(fullWithTools)[:30]), "truncated": true, "dropped_chars": chars(fullWithTools) - 30}},
		{"exactly max_chars", map[string]any{"turn": 1, "max_chars": chars(answer)},
			map[string]any{"turn": 1, "which": "last_message", "text": answer, "truncated": false, "dropped_chars": 0}},
		{"max_chars 0", map[string]any{"turn": 1, "max_chars": 0},
			map[string]any{"turn": 1, "which": "last_message", "text": "", "truncated": true, "dropped_chars": chars(answer)}},
		{"all with tools", map[string]any{"which": "all", "include_tools": true},
			map[string]any{"turn": 2, "which": "all", "text": "— turn 1 —\n\n" + fullWithTools + "\n\n— turn 2 —\n\nSecond turn.", "truncated": false, "dropped_chars": 0}},
		{"all cut", map[string]any{"which": "all", "max_chars": 12},
			map[string]any{"turn": 2, "which": "all", "text": "— turn 1 —\n\n", "truncated": true,
				"dropped_chars": chars("— turn 1 —\n\nLet me look.\n\n"+answer+"\n\n— turn 2 —\n\nSecond turn.") - 12}},
	}
	for _, c := range cases {
		c.args["agent_id"] = "out-1"
		text, isErr := call(t, s, "agent_output", c.args)
		if isErr {
			t.Errorf("%s: %s", c.name, text)
			continue
		}
		got := decodeKeys(t, text)
		if keys := sortedKeys(got); !slices.Equal(keys, kaimonOutputKeys) {
			t.Errorf("%s: reply keys %v, want Kaimon's %v (no usage once the agent is gone)", c.name, keys, kaimonOutputKeys)
		}
		c.want["agent_id"], c.want["status"], c.want["done"] = "out-1", "dead", true
		for k, v := range c.want {
			if mustJSON(got[k]) != mustJSON(v) {
				t.Errorf("%s: %s is %s, want %s", c.name, k, mustJSON(got[k]), mustJSON(v))
			}
		}
	}
}

// agent_run over MCP honours its timeout, allows one synchronous run per
// agent at a time, and frees the agent for the next run when one ends.
func TestMCPRunTimeoutAndOneRunAtATime(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{ollamaBackend(t, fake)}})
	s := fb.client(nil)
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "run-1", "model": "ollama:fake-model"}, &opened)

	// A turn that never ends: agent_run gives up after its timeout, and
	// the turn goes on until it is interrupted.
	fake.Script(fakemodel.Reply{Text: "stuck", Hang: true})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "agent_run", Arguments: map[string]any{"agent_id": "run-1", "text": "Hang.", "timeout": 0.5}})
	cancel()
	if err != nil {
		t.Fatalf("agent_run with a timeout of 0.5s did not answer within 20s: %v", err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || text != "Error running agent turn: agent 'run-1' run timed out after 0.5s" {
		t.Errorf("agent_run past its timeout: %q (error %v)", text, res.IsError)
	}
	var rec schemas.AgentRecord
	ok(t, s, "agent_status", map[string]any{"agent_id": "run-1"}, &rec)
	if rec.Status != schemas.StatusWorking || rec.Turn != 1 {
		t.Errorf("after a timed-out run the turn should still run: %s turn %d", rec.Status, rec.Turn)
	}
	var ir schemas.InterruptReply
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": "run-1"}, &ir)
	if !ir.Interrupted {
		t.Error("agent_interrupt of the hung turn said false")
	}
	poll.Until(t, 30*time.Second, "turn 1 to end", func() bool {
		ok(t, s, "agent_status", map[string]any{"agent_id": "run-1"}, &rec)
		return rec.Status == schemas.StatusIdle
	})

	// One synchronous run at a time: a second agent_run while the first
	// waits is refused, and sends no turn.
	fake.Script(fakemodel.Reply{Text: "held", Hang: true})
	type result struct {
		res *mcp.CallToolResult
		err error
	}
	first := make(chan result, 1)
	go func() {
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_run", Arguments: map[string]any{"agent_id": "run-1", "text": "Hold.", "timeout": 60}})
		first <- result{res, err}
	}()
	poll.Until(t, 30*time.Second, "the first run's turn 2 to start", func() bool {
		ok(t, s, "agent_status", map[string]any{"agent_id": "run-1"}, &rec)
		return rec.Status == schemas.StatusWorking && rec.Turn == 2
	})
	if text, isErr := call(t, s, "agent_run", map[string]any{"agent_id": "run-1", "text": "Me too.", "timeout": 60}); !isErr || text != "Error running agent turn: agent 'run-1' already has a synchronous run in flight" {
		t.Errorf("a second agent_run during the first: %q (error %v)", text, isErr)
	}
	ok(t, s, "agent_status", map[string]any{"agent_id": "run-1"}, &rec)
	if rec.Turn != 2 {
		t.Errorf("the refused run sent a turn: now at turn %d", rec.Turn)
	}
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": "run-1"}, &ir)
	if !ir.Interrupted {
		t.Error("agent_interrupt of the held turn said false")
	}
	select {
	case r := <-first:
		if r.err != nil || r.res.IsError {
			t.Errorf("the first run, interrupted: %v %s", r.err, mustJSON(r.res))
		} else if text := r.res.Content[0].(*mcp.TextContent).Text; text != `{"text":"held","turn":2,"stop_reason":"cancelled"}` {
			t.Errorf("the first run, interrupted, returned %s", text)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first run did not return after its turn was interrupted")
	}

	// The run is over, so the next one may start.
	fake.Script(fakemodel.Reply{Text: "Free again."})
	var ran schemas.RunReply
	ok(t, s, "agent_run", map[string]any{"agent_id": "run-1", "text": "Go.", "timeout": 60}, &ran)
	if ran.Text != "Free again." {
		t.Errorf("agent_run after the first ended: %+v", ran)
	}
}

// agent_set_model over MCP repoints a local-model agent: it answers
// switched true, the agent's status shows the new model, and the next turn
// asks the model server for it.
func TestMCPSetModel(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Models: []string{"fake-model", "other-model:7b"}})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{ollamaBackend(t, fake)}})
	s := fb.client(nil)
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "sm-1", "model": "ollama:fake-model"}, &opened)
	var ran schemas.RunReply
	ok(t, s, "agent_run", map[string]any{"agent_id": "sm-1", "text": "Before.", "timeout": 60}, &ran)

	if text, isErr := call(t, s, "agent_set_model", map[string]any{"agent_id": "sm-1", "model": "ollama:other-model:7b"}); isErr || text != `{"switched":true}` {
		t.Fatalf("agent_set_model: %q (error %v)", text, isErr)
	}
	var rec schemas.AgentRecord
	ok(t, s, "agent_status", map[string]any{"agent_id": "sm-1"}, &rec)
	if rec.Model != "ollama:other-model:7b" {
		t.Errorf("agent_status model after agent_set_model: %q", rec.Model)
	}
	ok(t, s, "agent_run", map[string]any{"agent_id": "sm-1", "text": "After.", "timeout": 60}, &ran)
	reqs := fake.Requests()
	if len(reqs) != 2 || reqs[0].Model != "fake-model" || reqs[1].Model != "other-model:7b" {
		var models []string
		for _, r := range reqs {
			models = append(models, r.Model)
		}
		t.Errorf("the model server was asked for %v, want [fake-model other-model:7b]", models)
	}
	// Kaimon answers false, not an error, for a model of another kind and
	// for an unknown agent.
	for _, args := range []map[string]any{
		{"agent_id": "sm-1", "model": "acp:opencode"},
		{"agent_id": "nobody", "model": "ollama:fake-model"},
	} {
		if text, isErr := call(t, s, "agent_set_model", args); isErr || text != `{"switched":false}` {
			t.Errorf("agent_set_model %v: %q (error %v)", args, text, isErr)
		}
	}
	ok(t, s, "agent_status", map[string]any{"agent_id": "sm-1"}, &rec)
	if rec.Model != "ollama:other-model:7b" {
		t.Errorf("a refused agent_set_model changed the model to %q", rec.Model)
	}
	// A bare tag is this agent's kind of model; its record keeps a string
	// that routes back to the same backend, never to claude.
	if text, isErr := call(t, s, "agent_set_model", map[string]any{"agent_id": "sm-1", "model": "fake-model"}); isErr || text != `{"switched":true}` {
		t.Fatalf("agent_set_model to a bare tag: %q (error %v)", text, isErr)
	}
	ok(t, s, "agent_status", map[string]any{"agent_id": "sm-1"}, &rec)
	if rec.Model != "ollama:fake-model" {
		t.Errorf("after switching to a bare tag the record says %q, want ollama:fake-model", rec.Model)
	}
}
