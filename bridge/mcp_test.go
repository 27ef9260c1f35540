package bridge_test

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// fabric is a broker with the MCP endpoint in front of it.
type fabric struct {
	t   *testing.T
	b   *broker.Broker
	f   *client.Direct
	url string
}

func startFabric(t *testing.T, cfg bridge.HTTPConfig) *fabric {
	t.Helper()
	b := natstest.Start(t)
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := bridge.NewMCP(bridge.MCPConfig{Client: f})
	ctx, cancel := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- m.ListenHTTP(ctx, "127.0.0.1:0", cfg, func(u string) { urls <- u }) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case u := <-urls:
		return &fabric{t: t, b: b, f: f, url: u}
	case err := <-done:
		done <- err // for the cleanup, which waits for it
		t.Fatalf("MCP endpoint: %v", err)
	}
	return nil
}

// startNode runs a node with the real claude CLI against a fake model,
// pointed at the fabric's MCP endpoint.
func (fb *fabric) startNode(fake *fakemodel.Server) func() {
	return fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fb.claudeBackend(fake)}})
}

// claudeBackend runs the pinned claude CLI against a fake model.
func (fb *fabric) claudeBackend(fake *fakemodel.Server) backend.Backend {
	argv := peers.Claude.Command(fb.t)
	return claude.New(claude.Config{Path: argv[0], Env: peers.ClaudeEnv(fb.t.TempDir(), fake.URL()), StopWait: time.Second})
}

// runNode runs a node on the fabric's broker, its agents pointed at the
// fabric's MCP endpoint, until the returned stop (or the test's end).
func (fb *fabric) runNode(cfg node.Config) func() {
	t := fb.t
	t.Helper()
	cfg.Conn = natstest.Connect(t, fb.b)
	cfg.Dir = t.TempDir()
	cfg.MCP = backend.MCPEndpoint{URL: fb.url}
	h, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	select {
	case <-h.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("node %s: %v", cfg.Name, err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node %s: %v", cfg.Name, err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// headerTransport adds headers to every request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// client connects the official MCP Go SDK client, with extra headers.
func (fb *fabric) client(headers map[string]string) *mcp.ClientSession {
	fb.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "shoal-test", Version: "1.0.0"}, nil)
	s, err := c.Connect(fb.t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url, HTTPClient: &http.Client{Transport: headerTransport(headers)}}, nil)
	if err != nil {
		fb.t.Fatalf("connect to %s: %v", fb.url, err)
	}
	fb.t.Cleanup(func() { s.Close() })
	return s
}

// call calls a tool and returns its text and whether it is an error. No
// call in these tests may take two minutes.
func call(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(res.Content) != 1 {
		t.Fatalf("%s returned %d content blocks", name, len(res.Content))
	}
	return res.Content[0].(*mcp.TextContent).Text, res.IsError
}

// ok calls a tool that must succeed and decodes its JSON into v.
func ok(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, v any) {
	t.Helper()
	text, isErr := call(t, s, name, args)
	if isErr {
		t.Fatalf("%s %v: %s", name, args, text)
	}
	if err := json.Unmarshal([]byte(text), v); err != nil {
		t.Fatalf("%s returned %q: %v", name, text, err)
	}
}

var toolNames = []string{"agent_open", "agent_send", "agent_run", "agent_output", "agent_status", "agent_set_model",
	"agent_list", "agent_interrupt", "agent_close", "agent_nodes", "agent_events", "agent_permit", "agent_pending", "agent_diff", "agent_fetch", "agent_job"}

// The official MCP Go SDK client lists the tools and drives a real claude
// agent through open, send, output, status, list, run, interrupt and
// close; agent_output still answers once the agent's node is gone.
func TestMCPDrivesRealClaude(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(
		fakemodel.Reply{Text: "Hello over MCP."},
		fakemodel.Reply{Text: "Ran synchronously."},
		fakemodel.Reply{Text: strings.Repeat("slow ", 60), ChunkSize: 5, Delay: 100 * time.Millisecond},
	)
	fb := startFabric(t, bridge.HTTPConfig{})
	stopNode := fb.startNode(fake)
	s := fb.client(nil)

	tools, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Name == "agent_open" {
			b, _ := json.Marshal(tl.InputSchema)
			if !strings.Contains(string(b), `"required":["cwd"]`) || !strings.Contains(string(b), `"disallowed_tools"`) {
				t.Errorf("agent_open schema %s", b)
			}
		}
	}
	slices.Sort(names)
	want := slices.Clone(toolNames)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	var opened struct {
		AgentID string `json:"agent_id"`
		Node    string `json:"node"`
	}
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "mcp-1"}, &opened)
	if opened.AgentID != "mcp-1" || opened.Node != "n1" {
		t.Fatalf("agent_open returned %+v", opened)
	}
	var sent schemas.SendReply
	ok(t, s, "agent_send", map[string]any{"agent_id": "mcp-1", "text": "Say hello."}, &sent)
	if sent.Turn != 1 {
		t.Fatalf("agent_send returned %+v", sent)
	}
	var out schemas.OutputReply
	poll.Until(t, 60*time.Second, "turn 1 to finish", func() bool {
		ok(t, s, "agent_output", map[string]any{"agent_id": "mcp-1"}, &out)
		return out.Done && out.Text != ""
	})
	if out.Text != "Hello over MCP." || out.Turn != 1 || out.Which != "last_message" || out.Usage == nil {
		t.Errorf("agent_output %+v", out)
	}
	var rec schemas.AgentRecord
	ok(t, s, "agent_status", map[string]any{"agent_id": "mcp-1"}, &rec)
	if rec.ID != "mcp-1" || rec.Node != "n1" || rec.Status != schemas.StatusIdle || rec.Turn != 1 {
		t.Errorf("agent_status %+v", rec)
	}
	var list schemas.ListReply
	ok(t, s, "agent_list", nil, &list)
	if len(list.Agents) != 1 || list.Agents[0].ID != "mcp-1" {
		t.Errorf("agent_list %+v", list)
	}
	var ran schemas.RunReply
	ok(t, s, "agent_run", map[string]any{"agent_id": "mcp-1", "text": "Run it.", "timeout": 60}, &ran)
	if ran.Text != "Ran synchronously." {
		t.Errorf("agent_run %+v", ran)
	}
	var ir schemas.InterruptReply
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": "mcp-1"}, &ir)
	if ir.Interrupted {
		t.Error("agent_interrupt with no turn running said true")
	}
	ok(t, s, "agent_send", map[string]any{"agent_id": "mcp-1", "text": "Go slowly."}, &sent)
	poll.Until(t, 60*time.Second, "turn 3 to stream some text", func() bool {
		ok(t, s, "agent_output", map[string]any{"agent_id": "mcp-1"}, &out)
		return out.Turn == 3 && out.Text != ""
	})
	if out.Done {
		t.Fatalf("a streaming turn reads done: %+v", out)
	}
	ok(t, s, "agent_interrupt", map[string]any{"agent_id": "mcp-1"}, &ir)
	if !ir.Interrupted {
		t.Fatal("agent_interrupt of a running turn said false")
	}
	poll.Until(t, 60*time.Second, "the interrupted turn 3 to end", func() bool {
		ok(t, s, "agent_status", map[string]any{"agent_id": "mcp-1"}, &rec)
		return rec.Status == schemas.StatusIdle && rec.Turn == 3
	})
	var closed schemas.CloseReply
	ok(t, s, "agent_close", map[string]any{"agent_id": "mcp-1"}, &closed)
	if !closed.Closed {
		t.Error("agent_close said false")
	}
	ok(t, s, "agent_close", map[string]any{"agent_id": "nobody"}, &closed)
	if closed.Closed {
		t.Error("agent_close of an unknown id said true")
	}
	if text, isErr := call(t, s, "agent_status", map[string]any{"agent_id": "nobody"}); !isErr || text != "No such agent: nobody" {
		t.Errorf("agent_status of an unknown id: %q %v", text, isErr)
	}
	if text, isErr := call(t, s, "agent_send", map[string]any{"agent_id": "nobody", "text": "x"}); !isErr || text != "Error sending to agent: no such agent: nobody" {
		t.Errorf("agent_send to an unknown id: %q %v", text, isErr)
	}
	var nodes struct {
		Nodes []schemas.NodeRecord `json:"nodes"`
	}
	ok(t, s, "agent_nodes", nil, &nodes)
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Name != "n1" {
		t.Errorf("agent_nodes %+v", nodes)
	}

	// The node goes away; the turns are still readable from the stream.
	stopNode()
	ok(t, s, "agent_output", map[string]any{"agent_id": "mcp-1", "turn": 1}, &out)
	if out.Text != "Hello over MCP." || !out.Done {
		t.Errorf("agent_output after the node is gone: %+v", out)
	}
	ok(t, s, "agent_output", map[string]any{"agent_id": "mcp-1", "which": "all", "include_tools": true}, &out)
	if !strings.Contains(out.Text, "— turn 1 —\n\nHello over MCP.") || !strings.Contains(out.Text, "— turn 2 —\n\nRan synchronously.") {
		t.Errorf("agent_output all:\n%s", out.Text)
	}
	var evs schemas.EventsReply
	ok(t, s, "agent_events", map[string]any{"agent_id": "mcp-1", "from_turn": 2}, &evs)
	if len(evs.Events) == 0 || !strings.Contains(string(evs.Events[0].Event), `"kind":"user_text"`) || evs.More || evs.NextEvent == 0 {
		t.Errorf("agent_events from turn 2: %s", mustJSON(evs))
	}
	for _, e := range evs.Events {
		if strings.Contains(string(e.Event), `"delta":true`) {
			t.Errorf("agent_events returned a delta without include_deltas: %s", e.Event)
		}
	}
	if text, isErr := call(t, s, "agent_send", map[string]any{"agent_id": "mcp-1", "text": "x"}); !isErr || text != "Error sending to agent: agent 'mcp-1' is dead" {
		t.Errorf("agent_send to a closed agent: %q", text)
	}
}

// toolArg is one argument of a tool as Kaimon §3 (and Shoal's additions)
// define it: its JSON type, whether it is required, and its enum.
type toolArg struct {
	name     string
	kind     string // string, number, integer, boolean, string[], map
	required bool
	enum     []string
}

// kaimonArgs are the arguments of every tool, from Kaimon §3 plus Shoal's
// additive ones (node and labels on agent_open, agent_events,
// agent_nodes). A tool may grow optional arguments beyond these.
var kaimonArgs = map[string][]toolArg{
	"agent_open": {{name: "cwd", kind: "string", required: true}, {name: "model", kind: "string"}, {name: "effort", kind: "string"},
		{name: "permission", kind: "string", enum: []string{"default", "ask", "notebook", "specialist", "lab", "auto", "bypass"}},
		{name: "permission_mode", kind: "string"}, {name: "allowed_tools", kind: "string[]"}, {name: "only", kind: "boolean"},
		{name: "disallowed_tools", kind: "string[]"}, {name: "mcp_config", kind: "string"}, {name: "system_prompt", kind: "string"},
		{name: "id", kind: "string"}, {name: "node", kind: "string"}, {name: "labels", kind: "map"}},
	"agent_send": {{name: "agent_id", kind: "string", required: true}, {name: "text", kind: "string", required: true}},
	"agent_run": {{name: "agent_id", kind: "string", required: true}, {name: "text", kind: "string", required: true},
		{name: "timeout", kind: "number"}},
	"agent_output": {{name: "agent_id", kind: "string", required: true}, {name: "turn", kind: "integer"},
		{name: "which", kind: "string", enum: []string{"last_message", "full_turn", "all"}},
		{name: "include_tools", kind: "boolean"}, {name: "max_chars", kind: "integer"}},
	"agent_status":    {{name: "agent_id", kind: "string", required: true}},
	"agent_set_model": {{name: "agent_id", kind: "string", required: true}, {name: "model", kind: "string", required: true}},
	"agent_list":      nil,
	"agent_interrupt": {{name: "agent_id", kind: "string", required: true}},
	"agent_close":     {{name: "agent_id", kind: "string", required: true}},
	"agent_events": {{name: "agent_id", kind: "string", required: true}, {name: "from_event", kind: "integer"},
		{name: "from_turn", kind: "integer"}, {name: "since", kind: "string"}, {name: "max", kind: "integer"},
		{name: "include_deltas", kind: "boolean"}},
	"agent_nodes": nil,
	"agent_permit": {{name: "agent_id", kind: "string", required: true}, {name: "request_id", kind: "string", required: true},
		{name: "decision", kind: "string", required: true, enum: []string{"allow", "deny"}}, {name: "option", kind: "string"},
		{name: "message", kind: "string"}, {name: "input", kind: "object"}},
	"agent_pending": nil,
	// Shoal's own, for agents on a repository.
	"agent_diff":  {{name: "agent_id", kind: "string", required: true}, {name: "stat", kind: "boolean"}},
	"agent_fetch": {{name: "agent_id", kind: "string", required: true}, {name: "into", kind: "string"}},
	"agent_job":   nil,
}

// advertisedArgs reads each tool's arguments from its advertised input
// schema.
func advertisedArgs(t *testing.T, s *mcp.ClientSession) map[string][]toolArg {
	t.Helper()
	tools, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]toolArg{}
	for _, tl := range tools.Tools {
		b, _ := json.Marshal(tl.InputSchema)
		var schema struct {
			Properties map[string]struct {
				Type  string   `json:"type"`
				Enum  []string `json:"enum"`
				Items *struct {
					Type string `json:"type"`
				} `json:"items"`
				AdditionalProperties *struct {
					Type string `json:"type"`
				} `json:"additionalProperties"`
			} `json:"properties"`
			Required []string `json:"required"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatalf("%s's input schema %s: %v", tl.Name, b, err)
		}
		args := []toolArg{}
		for name, p := range schema.Properties {
			kind := p.Type
			switch {
			case p.Type == "array" && p.Items != nil && p.Items.Type == "string":
				kind = "string[]"
			case p.Type == "object" && p.AdditionalProperties != nil && p.AdditionalProperties.Type == "string":
				kind = "map"
			}
			args = append(args, toolArg{name: name, kind: kind, required: slices.Contains(schema.Required, name), enum: p.Enum})
		}
		slices.SortFunc(args, func(a, b toolArg) int { return strings.Compare(a.name, b.name) })
		out[tl.Name] = args
	}
	return out
}

// validArgs are well-typed values for a tool's required arguments.
func validArgs(args []toolArg) map[string]any {
	m := map[string]any{}
	for _, a := range args {
		switch {
		case a.required && a.enum != nil:
			m[a.name] = a.enum[0]
		case a.required:
			m[a.name] = "a"
		}
	}
	return m
}

// wrongValues are values of the wrong type for an argument of kind, with
// how the message names their type.
func wrongValues(kind string) map[string]any {
	switch kind {
	case "string":
		return map[string]any{"the number 7": 7, "a boolean": true}
	case "number":
		return map[string]any{"a string": "soon", "an array": []any{1}}
	case "integer":
		return map[string]any{"the number 1.5": 1.5, "a string": "3"}
	case "boolean":
		return map[string]any{"a string": "yes", "the number 1": 1}
	case "string[]":
		return map[string]any{"a string": "Read", "an array whose item 1 is the number 3": []any{"Read", 3}}
	case "map":
		return map[string]any{`an object whose "gpu" is the number 1`: map[string]any{"gpu": 1}, "a string": "gpu=yes"}
	case "object":
		return map[string]any{"a string": "{}", "an array": []any{1}}
	}
	return nil
}

func kindWords(kind string) string {
	switch kind {
	case "string[]":
		return "an array of strings"
	case "map":
		return "an object of strings"
	case "object":
		return "an object"
	case "integer":
		return "an integer"
	}
	return "a " + kind
}

// Every tool rejects an unknown argument, each missing required argument
// and a wrong type or value for each argument, with Kaimon's wording and a
// message that names the argument.
func TestMCPValidation(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	s := fb.client(nil)
	advertised := advertisedArgs(t, s)
	if len(advertised) != len(toolNames) {
		t.Errorf("%d tools advertised, want %d", len(advertised), len(toolNames))
	}
	type row struct {
		tool, what string
		args       map[string]any
		want       string
		partOf     bool // want is part of the message, not all of it
	}
	var rows []row
	for _, tool := range toolNames {
		args, found := advertised[tool]
		if !found {
			t.Errorf("%s is not advertised", tool)
			continue
		}
		// The advertised schema has Kaimon's arguments, with their types
		// and required set; it may have more, all optional.
		for _, want := range kaimonArgs[tool] {
			i := slices.IndexFunc(args, func(a toolArg) bool { return a.name == want.name })
			if i < 0 {
				t.Errorf("%s does not advertise %s", tool, want.name)
				continue
			}
			if got := args[i]; got.kind != want.kind || got.required != want.required || !slices.Equal(got.enum, want.enum) {
				t.Errorf("%s advertises %s as %+v, want %+v", tool, want.name, got, want)
			}
		}
		var names []string
		for _, a := range args {
			names = append(names, a.name)
			if a.required && !slices.ContainsFunc(kaimonArgs[tool], func(k toolArg) bool { return k.name == a.name }) {
				t.Errorf("%s requires %s, which Kaimon does not", tool, a.name)
			}
		}

		unknown := validArgs(args)
		unknown["bogus_arg"] = 1
		rows = append(rows, row{tool, "an unknown argument", unknown,
			"Unknown parameter(s): bogus_arg. Valid parameters are: " + strings.Join(names, ", "), false})

		for _, a := range args {
			if a.required {
				missing := validArgs(args)
				delete(missing, a.name)
				rows = append(rows, row{tool, "no " + a.name, missing, "Missing required parameter(s): " + a.name, false})
				null := validArgs(args)
				null[a.name] = nil
				rows = append(rows, row{tool, a.name + " null", null, "Missing required parameter(s): " + a.name, false})
			}
			wrong := wrongValues(a.kind)
			if wrong == nil {
				t.Errorf("%s's %s has a type no row covers: %q", tool, a.name, a.kind)
			}
			for typeWords, v := range wrong {
				bad := validArgs(args)
				bad[a.name] = v
				rows = append(rows, row{tool, a.name + " as " + typeWords, bad,
					"Invalid parameter(s): " + a.name + " must be " + kindWords(a.kind) + ", not " + typeWords, false})
			}
			if a.enum != nil {
				bad := validArgs(args)
				bad[a.name] = "bogus"
				rows = append(rows, row{tool, a.name + " outside its enum", bad,
					"Invalid parameter(s): " + a.name + " must be one of " + strings.Join(a.enum, ", ") + `, not "bogus"`, false})
			}
		}
	}
	// Several problems at once are all reported, joined Kaimon's way.
	rows = append(rows,
		row{"agent_open", "two unknown", map[string]any{"cwd": "/x", "colour": "red", "age": 3}, "Unknown parameter(s): age, colour. Valid parameters are: ", true},
		row{"agent_open", "unknown and missing", map[string]any{"colour": "red"}, ". Missing required parameter(s): cwd", true},
		row{"agent_send", "both missing", map[string]any{}, "Missing required parameter(s): agent_id, text", false},
		row{"agent_status", "unknown and missing", map[string]any{"id": "a"}, "Unknown parameter(s): id. Valid parameters are: agent_id", true},
		row{"agent_run", "missing and wrong", map[string]any{"agent_id": "a", "timeout": "soon"}, "Missing required parameter(s): text. Invalid parameter(s): timeout must be a number, not a string", false},
	)
	for _, r := range rows {
		text, isErr := call(t, s, r.tool, r.args)
		if !isErr || (!r.partOf && text != r.want) || (r.partOf && !strings.Contains(text, r.want)) {
			t.Errorf("%s with %s %s:\n got %q (error %v)\nwant %q", r.tool, r.what, mustJSON(r.args), text, isErr, r.want)
		}
	}
	t.Logf("%d validation rows", len(rows))
	if text, isErr := call(t, s, "agent_run", map[string]any{"agent_id": "a", "text": "x", "timeout": -1}); !isErr || text != "Invalid parameter(s): timeout must be more than 0, not -1" {
		t.Errorf("negative timeout: %q", text)
	}
	if text, isErr := call(t, s, "agent_run", map[string]any{"agent_id": "a", "text": "x", "timeout": 1e308}); !isErr ||
		text != "Invalid parameter(s): timeout must be at most 86400, not 1e+308" {
		t.Errorf("a timeout past a day: %q", text)
	}
	if text, isErr := call(t, s, "agent_open", map[string]any{"cwd": t.TempDir()}); !isErr || !strings.HasPrefix(text, "Error opening agent: no node is running") {
		t.Errorf("open with no node: %q", text)
	}
}

// putRecord writes an agent record as a node would.
func putRecord(t *testing.T, fb *fabric, rec schemas.AgentRecord) {
	t.Helper()
	_, js := natstest.JetStream(t, fb.b)
	kv, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(t.Context(), rec.ID, b); err != nil {
		t.Fatal(err)
	}
	_ = jetstream.KeyValuePut
}

// putNode writes node rec's record, as its heartbeat would: a node that
// runs claude agents, heard from now.
func putNode(t *testing.T, fb *fabric, rec schemas.NodeRecord) {
	t.Helper()
	_, js := natstest.JetStream(t, fb.b)
	kv, err := js.KeyValue(t.Context(), schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	rec.Instance, rec.StartedAt, rec.Heartbeat = "1", now, now
	if rec.Backends == nil {
		rec.Backends = []schemas.BackendInfo{{Kind: "claude", Ready: true}}
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(t.Context(), rec.Name, b); err != nil {
		t.Fatal(err)
	}
}

// standInOpens stands in for node's open endpoint until the test ends:
// each open that reaches it is passed on (up to n waiting) and refused.
func standInOpens(t *testing.T, fb *fabric, node string, n int) <-chan schemas.OpenRequest {
	t.Helper()
	opens := make(chan schemas.OpenRequest, n)
	stand := natstest.Connect(t, fb.b)
	sub, err := stand.Subscribe(schemas.ControlSubject(node, schemas.VerbOpen), func(m *nats.Msg) {
		var req schemas.OpenRequest
		json.Unmarshal(m.Data, &req)
		opens <- req
		m.Respond([]byte(`{"error":{"code":"unavailable","message":"a stand-in"}}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := stand.Flush(); err != nil {
		t.Fatal(err)
	}
	return opens
}

// A call that carries an agent's id is judged by that agent's policy: the
// recursion guard refuses open, drive and close but not observation; under
// only the agent sees and may call just what it names; paths stay in its
// workspace.
func TestMCPDoor(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	work := t.TempDir()
	for _, d := range []string{"a", "b", "c/sub", "c-sibling"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(work, "c-sibling"), filepath.Join(work, "c", "link")); err != nil {
		t.Fatal(err)
	}
	guard, _ := schemas.ComposePolicy("", "", nil, nil, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "guarded", Status: schemas.StatusIdle, Node: "n9", Policy: guard.Record(work + "/a")})
	nested := []string{}
	only, _ := schemas.ComposePolicy("", "", []string{schemas.MCPToolPrefix + "agent_status", "Read"}, &nested, true)
	putRecord(t, fb, schemas.AgentRecord{ID: "narrow", Status: schemas.StatusIdle, Node: "n9", Policy: only.Record(work + "/b")})
	free, _ := schemas.ComposePolicy("", "", nil, &nested, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "free", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(work + "/c")})

	g := fb.client(map[string]string{schemas.AgentIDHeader: "guarded"})
	var nodes schemas.NodesReply
	ok(t, g, "agent_nodes", nil, &nodes)
	for _, name := range []string{"agent_open", "agent_send", "agent_run", "agent_interrupt", "agent_close", "agent_set_model", "agent_status", "agent_list"} {
		text, isErr := call(t, g, name, argsFor(name))
		if !isErr || !strings.HasPrefix(text, name+" refused: the recursion guard") {
			t.Errorf("%s by a guarded agent: %q", name, text)
		}
	}
	// The guard leaves reads open, of the agent's own subtree: itself
	// here, and no other agent.
	if text, isErr := call(t, g, "agent_output", map[string]any{"agent_id": "guarded"}); isErr && strings.Contains(text, "refused") {
		t.Errorf("agent_output of itself by a guarded agent: %q", text)
	}
	if text, isErr := call(t, g, "agent_output", map[string]any{"agent_id": "narrow"}); !isErr || !strings.Contains(text, "agent_output refused: agent guarded may not read the output of agent narrow (not of its tree): rule subtree") {
		t.Errorf("agent_output of another agent by a guarded agent: %q", text)
	}
	f := fb.client(map[string]string{schemas.AgentIDHeader: "free"})
	var list schemas.ListReply
	ok(t, f, "agent_list", nil, &list)
	if len(list.Agents) != 1 || list.Agents[0].ID != "free" {
		t.Errorf("agent_list through the door, guard lifted: %+v, want the agent itself alone", list.Agents)
	}

	n := fb.client(map[string]string{schemas.AgentIDHeader: "narrow"})
	tools, err := n.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 1 || tools.Tools[0].Name != "agent_status" {
		var names []string
		for _, tl := range tools.Tools {
			names = append(names, tl.Name)
		}
		t.Errorf("an only agent sees %v, want just agent_status", names)
	}
	if text, isErr := call(t, n, "agent_list", nil); !isErr || text != "agent_list refused: not in this agent's allowlist" {
		t.Errorf("agent_list by an only agent: %q", text)
	}

	fr := fb.client(map[string]string{schemas.AgentIDHeader: "free"})
	if text, isErr := call(t, fr, "agent_open", map[string]any{"cwd": "/etc"}); !isErr || text != "agent_open refused: path is outside this agent's workspace: /etc" {
		t.Errorf("agent_open outside the workspace: %q", text)
	}
	if text, isErr := call(t, fr, "agent_open", map[string]any{"cwd": work + "/c/sub/../../c-sibling"}); !isErr || !strings.Contains(text, "outside this agent's workspace") {
		t.Errorf("agent_open escaping with ..: %q", text)
	}
	if text, isErr := call(t, fr, "agent_open", map[string]any{"cwd": work + "/c/link"}); !isErr || !strings.Contains(text, "outside this agent's workspace") {
		t.Errorf("agent_open escaping through a symlink: %q", text)
	}
	if text, _ := call(t, fr, "agent_open", map[string]any{"cwd": work + "/c/sub"}); strings.Contains(text, "refused") {
		t.Errorf("agent_open inside the workspace was refused: %q", text)
	}
	if text, isErr := call(t, fr, "agent_open", map[string]any{"cwd": work + "/c/sub", "parent": "guarded", "depth": 1}); !isErr || !strings.Contains(text, "Unknown parameter(s): depth, parent") {
		t.Errorf("agent_open naming its own parent and depth: %q", text)
	}
	// Nesting is bounded: an agent at the deepest depth opens none.
	putRecord(t, fb, schemas.AgentRecord{ID: "deep", Status: schemas.StatusIdle, Node: "n9", Parent: "free", Depth: schemas.DefaultMaxDepth, Policy: free.Record(work + "/c")})
	deep := fb.client(map[string]string{schemas.AgentIDHeader: "deep"})
	if text, isErr := call(t, deep, "agent_open", map[string]any{"cwd": work + "/c/sub"}); !isErr || !strings.Contains(text, "agents may open agents only 2 deep") {
		t.Errorf("agent_open at the deepest depth: %q", text)
	}
	// Output of a turn that does not exist is not found.
	if text, isErr := call(t, fb.client(nil), "agent_output", map[string]any{"agent_id": "guarded", "turn": 5}); !isErr ||
		text != "Error reading agent output: agent guarded has no turn 5 (it has no turns yet)" {
		t.Errorf("output of a turn that does not exist: %q", text)
	}
	ghost := fb.client(map[string]string{schemas.AgentIDHeader: "ghost"})
	if text, isErr := call(t, ghost, "agent_list", nil); !isErr || !strings.Contains(text, "the calling agent ghost is unknown") {
		t.Errorf("an unknown calling agent: %q", text)
	}
}

func argsFor(tool string) map[string]any {
	switch tool {
	case "agent_open":
		return map[string]any{"cwd": "/"}
	case "agent_send", "agent_run":
		return map[string]any{"agent_id": "free", "text": "x"}
	case "agent_set_model":
		return map[string]any{"agent_id": "free", "model": "opus"}
	case "agent_list", "agent_nodes":
		return nil
	}
	return map[string]any{"agent_id": "free"}
}

// Off loopback the endpoint needs a token; Origin is checked.
func TestMCPHTTPSecurity(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	f, _ := client.NewDirect(natstest.Connect(t, b), client.Config{})
	m := bridge.NewMCP(bridge.MCPConfig{Client: f})
	err := m.ListenHTTP(t.Context(), "0.0.0.0:0", bridge.HTTPConfig{}, nil)
	if err == nil || !strings.Contains(err.Error(), "without a bearer token") {
		t.Fatalf("an open listener without a token: %v", err)
	}
	fb := startFabric(t, bridge.HTTPConfig{Token: "s3cret"})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	var body string
	post := func(h map[string]string) int {
		req, _ := http.NewRequest("POST", fb.url, strings.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		said, _ := io.ReadAll(res.Body)
		res.Body.Close()
		body = strings.TrimSpace(string(said))
		return res.StatusCode
	}
	// A wrong token is told apart from none: a person checking their
	// client's configuration looks for a wrong value, not a missing header.
	if code := post(nil); code != http.StatusUnauthorized || body != "a bearer token is required" {
		t.Errorf("no token: %d %q", code, body)
	}
	if code := post(map[string]string{"Authorization": "Bearer wrong"}); code != http.StatusUnauthorized || !strings.Contains(body, "is not one this endpoint accepts") {
		t.Errorf("a wrong token: %d %q", code, body)
	}
	if code := post(map[string]string{"Authorization": "Bearer s3cret"}); code != http.StatusOK {
		t.Errorf("the right token: %d", code)
	}
	// An agent presents its own token, derived for this life of it; its id
	// alone is no credential, nor is another agent's token, a dead
	// agent's, or the token of an earlier life.
	free, _ := schemas.ComposePolicy("lab", "", nil, &[]string{}, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "a1", Status: schemas.StatusIdle, Node: "n9", RequestID: "open-2", Policy: free.Record("/")})
	putRecord(t, fb, schemas.AgentRecord{ID: "a2", Status: schemas.StatusIdle, Node: "n9", RequestID: "open-3", Policy: free.Record("/")})
	putRecord(t, fb, schemas.AgentRecord{ID: "gone", Status: schemas.StatusDead, Node: "n9", RequestID: "open-4", Policy: free.Record("/")})
	agent := func(id, token string) map[string]string {
		return map[string]string{schemas.AgentIDHeader: id, "Authorization": "Bearer " + token}
	}
	for what, c := range map[string]struct {
		h    map[string]string
		want int
	}{
		"its own token":        {agent("a1", schemas.EndpointAgentToken("s3cret", "n9", "a1", "open-2")), http.StatusOK},
		"its id alone":         {map[string]string{schemas.AgentIDHeader: "a1"}, http.StatusUnauthorized},
		"another's token":      {agent("a1", schemas.EndpointAgentToken("s3cret", "n9", "a2", "open-3")), http.StatusUnauthorized},
		"an earlier life's":    {agent("a1", schemas.EndpointAgentToken("s3cret", "n9", "a1", "open-1")), http.StatusUnauthorized},
		"a dead agent's":       {agent("gone", schemas.EndpointAgentToken("s3cret", "n9", "gone", "open-4")), http.StatusUnauthorized},
		"a token without id":   {map[string]string{"Authorization": "Bearer " + schemas.EndpointAgentToken("s3cret", "n9", "a1", "open-2")}, http.StatusUnauthorized},
		"another node's key's": {agent("a1", schemas.EndpointAgentToken("s3cret", "n8", "a1", "open-2")), http.StatusUnauthorized},
		"its node's key":       {agent("a1", schemas.NodeKey("s3cret", "n9")), http.StatusUnauthorized},
		"the operator's, too":  {agent("a1", "s3cret"), http.StatusOK},
	} {
		if code := post(c.h); code != c.want {
			t.Errorf("an agent with %s: %d, want %d", what, code, c.want)
		}
	}
	if code := post(map[string]string{"Authorization": "Bearer s3cret", "Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("a foreign origin: %d", code)
	}
	if code := post(map[string]string{"Authorization": "Bearer s3cret", "Origin": "http://localhost:3000"}); code != http.StatusOK {
		t.Errorf("a loopback origin: %d", code)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url, HTTPClient: &http.Client{Transport: headerTransport{"Authorization": "Bearer s3cret"}}}, nil)
	if err != nil {
		t.Fatalf("a client with the token: %v", err)
	}
	s.Close()
}

// Each token has its rights: the observer's token sees and calls only the
// tools that read; the control token drives; no token gets nothing.
func TestMCPTokenRights(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{Token: "driver", ObserverToken: "watcher"})
	guard, _ := schemas.ComposePolicy("", "", nil, nil, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "seen", Status: schemas.StatusIdle, Node: "n9", Policy: guard.Record("/work/a")})

	watcher := fb.client(map[string]string{"Authorization": "Bearer watcher"})
	tools, err := watcher.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	if strings.Join(names, " ") != "agent_diff agent_events agent_list agent_nodes agent_output agent_pending agent_status" {
		t.Errorf("an observer's token sees %v", names)
	}
	var list schemas.ListReply
	ok(t, watcher, "agent_list", nil, &list)
	if len(list.Agents) != 1 {
		t.Errorf("agent_list with the observer's token: %+v", list)
	}
	for _, name := range []string{"agent_open", "agent_send", "agent_run", "agent_interrupt", "agent_close", "agent_set_model"} {
		text, isErr := call(t, watcher, name, argsFor(name))
		if !isErr || !strings.HasPrefix(text, name+" refused: an observer may not ") || !strings.Contains(text, "rule observer") {
			t.Errorf("%s with the observer's token: %q", name, text)
		}
	}
	driver := fb.client(map[string]string{"Authorization": "Bearer driver"})
	if text, _ := call(t, driver, "agent_close", map[string]any{"agent_id": "nobody"}); strings.Contains(text, "refused") {
		t.Errorf("agent_close with the control token: %q", text)
	}
	// The observer's token names no agent: with an agent's id beside it,
	// it is refused, not widened to that agent's rights.
	c0 := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	if _, err := c0.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url, HTTPClient: &http.Client{Transport: headerTransport{
		"Authorization": "Bearer watcher", schemas.AgentIDHeader: "seen"}}}, nil); err == nil {
		t.Error("the observer's token with an agent's id connected")
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	if _, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url}, nil); err == nil {
		t.Error("a client without a token connected")
	}
}

// The door judges an agent's calls by the same matcher as ACP agents and
// local models: a deny of agent_* refuses every agent_ tool, observation
// included, and nothing else.
func TestMCPDoorRefusesAPrefixEntry(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	deny := []string{"agent_*"}
	pol, _ := schemas.ComposePolicy("", "", nil, &deny, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "prefixed", Status: schemas.StatusIdle, Node: "n9", Policy: pol.Record("/work/p")})
	c := fb.client(map[string]string{schemas.AgentIDHeader: "prefixed"})
	for _, name := range []string{"agent_list", "agent_status", "agent_output", "agent_open", "agent_nodes", "agent_events"} {
		args := argsFor(name)
		if name == "agent_list" || name == "agent_nodes" {
			args = nil
		}
		text, isErr := call(t, c, name, args)
		if !isErr || text != name+" refused: denied by this agent's policy (agent_*)" {
			t.Errorf("%s by an agent denied agent_*: %q", name, text)
		}
	}
}

// The tools' input schemas are the embedded request schemas, each made
// self-contained ($refs to defs.json inlined), and the hints say which
// tools only read, which destroys and which a retry repeats safely.
func TestMCPToolsAreTheEmbeddedSchemas(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	tools, err := fb.client(nil).ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var defs map[string]any
	b, _ := fs.ReadFile(schemas.JSONSchemas, "jsonschema/defs.json")
	json.Unmarshal(b, &defs)
	var resolve func(v any) any
	resolve = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			out := map[string]any{}
			if ref, ok := x["$ref"].(string); ok {
				for k, dv := range resolve(defs["$defs"].(map[string]any)[strings.TrimPrefix(ref, "../defs.json#/$defs/")]).(map[string]any) {
					out[k] = dv
				}
			}
			for k, c := range x {
				if k != "$ref" && k != "$schema" && k != "$id" {
					out[k] = resolve(c)
				}
			}
			// What Shoal sets itself (readOnly) is no argument.
			if props, ok := out["properties"].(map[string]any); ok {
				for k, p := range props {
					if ro, _ := p.(map[string]any)["readOnly"].(bool); ro {
						delete(props, k)
					}
				}
			}
			return out
		case []any:
			for i := range x {
				x[i] = resolve(x[i])
			}
		}
		return v
	}
	schemaOf := map[string]string{"agent_open": "open_request", "agent_send": "send_request", "agent_run": "run_request",
		"agent_output": "output_request", "agent_status": "status_request", "agent_list": "list_request",
		"agent_set_model": "set_model_request", "agent_interrupt": "agent_request", "agent_close": "agent_request",
		"agent_events": "events_request", "agent_nodes": "nodes_request", "agent_permit": "permit_request", "agent_pending": "pending_request",
		"agent_diff": "diff_request", "agent_fetch": "fetch_request", "agent_job": "job_request"}
	readOnly := []string{"agent_output", "agent_status", "agent_list", "agent_events", "agent_nodes", "agent_pending", "agent_diff"}
	if len(tools.Tools) != len(schemaOf) {
		t.Fatalf("%d tools, want %d", len(tools.Tools), len(schemaOf))
	}
	for _, tool := range tools.Tools {
		raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/"+schemaOf[tool.Name]+".json")
		if err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		var want, got any
		json.Unmarshal(raw, &want)
		gotRaw, _ := json.Marshal(tool.InputSchema)
		json.Unmarshal(gotRaw, &got)
		if !reflect.DeepEqual(resolve(want), got) {
			t.Errorf("%s's input schema\n got %s\nwant %s", tool.Name, gotRaw, mustJSON(resolve(want)))
		}
		// Kaimon's agent_list takes no arguments; the fabric service's
		// paged list is not MCP's.
		if props, _ := got.(map[string]any)["properties"].(map[string]any); tool.Name == "agent_list" && len(props) > 0 {
			t.Errorf("agent_list advertises arguments %s; Kaimon's takes none", mustJSON(props))
		}
		a := tool.Annotations
		ro := slices.Contains(readOnly, tool.Name)
		// Open, send and run act anew on each call without a request_id (and
		// a job on each call);
		// a second interrupt, close, model switch or answer changes
		// nothing the first did not.
		anew := slices.Contains([]string{"agent_open", "agent_send", "agent_run", "agent_job"}, tool.Name)
		destroys := tool.Name == "agent_close" || tool.Name == "agent_interrupt"
		if a == nil || a.ReadOnlyHint != ro || a.DestructiveHint == nil || *a.DestructiveHint != destroys ||
			a.IdempotentHint != !anew || a.OpenWorldHint == nil || *a.OpenWorldHint {
			t.Errorf("%s's hints: %s", tool.Name, mustJSON(a))
		}
	}
}
