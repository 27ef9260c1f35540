package bridge_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// The real claude CLI, given the MCP config its node generated, calls
// agent_nodes through the door and is refused agent_open under the default
// recursion guard. The lab preset grants Shoal's MCP server, as a claude
// agent in -p mode may call MCP tools only when they are allowed.
//
// Which layer refuses: the node hands the guard to the CLI as
// --disallowedTools mcp__shoal__agent_open …, so the CLI drops agent_open
// from the tools it offers the model and answers the model's call itself
// ("No such tool available"); the call never reaches the door. The door's
// own refusal of the guard is covered by TestMCPDoor, with a client that
// carries the agent's id header; with the real CLI the door can be shown
// refusing only what the CLI lets through, which TestRealClaudeDoorBackstop
// does.
func TestRealClaudeThroughTheDoor(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb, door := startRecordedFabric(t)
	cwd := t.TempDir()
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_nodes", Input: json.RawMessage(`{}`)}}},
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_open", Input: json.RawMessage(`{"cwd":"` + cwd + `"}`)}}},
		fakemodel.Reply{Text: "Done with tools."},
	)
	fb.startNode(fake)
	rep, err := fb.f.Open(t.Context(), schemas.OpenRequest{CWD: cwd, Node: "n1", Permission: "lab"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fb.f.Run(t.Context(), schemas.RunRequest{AgentID: rep.AgentID, Text: "List the agents, then open one.", Timeout: 60}); err != nil {
		t.Fatalf("run: %v", err)
	}
	reqs := fake.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the model was asked %d times, with these tool results: %s", len(reqs), toolResults(reqs))
	}

	// The CLI offers agent_nodes and, because of --disallowedTools, not
	// agent_open.
	offered := reqs[0].Tools
	if !slices.Contains(offered, schemas.MCPToolPrefix+"agent_nodes") {
		t.Errorf("the CLI did not offer Shoal's agent_nodes; it offered: %v", offered)
	}
	if slices.Contains(offered, schemas.MCPToolPrefix+"agent_open") {
		t.Errorf("the CLI offered agent_open to a guarded agent: %v", offered)
	}

	// agent_nodes went through the door, as this agent: the door saw the
	// call with the agent's id header and answered it with the nodes,
	// and that answer is what reached the model.
	calls := door.toolCalls()
	if len(calls) != 1 || calls[0].Tool != "agent_nodes" || calls[0].AgentID != rep.AgentID {
		t.Fatalf("the door saw these tool calls: %s; want one agent_nodes from %s", mustJSON(calls), rep.AgentID)
	}
	if !strings.Contains(calls[0].Reply, `\"nodes\":[`) || strings.Contains(calls[0].Reply, `"isError":true`) {
		t.Errorf("the door answered agent_nodes with %s", calls[0].Reply)
	}
	list := reqs[1].ToolResults
	if len(list) != 1 || list[0].Name != schemas.MCPToolPrefix+"agent_nodes" || list[0].IsError {
		t.Fatalf("agent_nodes's result to the model: %+v", list)
	}
	var listed schemas.NodesReply
	if err := json.Unmarshal([]byte(list[0].Content), &listed); err != nil || len(listed.Nodes) != 1 || listed.Nodes[0].Name != rep.Node {
		t.Errorf("agent_nodes through the door reached the model as %q (%v)", list[0].Content, err)
	}

	// agent_open is refused by the CLI itself: this exact text is the
	// CLI's, and the door never saw the call (checked above: one call).
	open := reqs[2].ToolResults
	const cliRefusal = "<tool_use_error>Error: No such tool available: " + schemas.MCPToolPrefix + "agent_open</tool_use_error>"
	if len(open) != 1 || !open[0].IsError || open[0].Content != cliRefusal {
		t.Fatalf("agent_open's result to the model: %+v, want the CLI's refusal %q", open, cliRefusal)
	}
	t.Logf("agent_open was refused by the claude CLI (--disallowedTools), before the door: %s", open[0].Content)
	recs, err := fb.f.List(t.Context())
	if err != nil || len(recs) != 1 {
		t.Errorf("%d agents after a refused agent_open (%v)", len(recs), err)
	}
}

// The door is the backstop behind the CLI: what the CLI lets through, the
// door still judges by the agent's recorded policy. With the guard lifted
// for agent_open but agent_close denied by its bare name (which the door
// matches, §6.3, and the CLI does not), the real claude CLI calls both;
// the door refuses agent_open for a directory outside the agent's
// workspace and agent_close by the policy, and those refusals are what
// reach the model.
func TestRealClaudeDoorBackstop(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb, door := startRecordedFabric(t)
	cwd, elsewhere := t.TempDir(), t.TempDir()
	fb.startNode(fake)
	deny := []string{"agent_close"}
	rep, err := fb.f.Open(t.Context(), schemas.OpenRequest{CWD: cwd, Node: "n1", Permission: "lab", DisallowedTools: &deny})
	if err != nil {
		t.Fatal(err)
	}
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_open", Input: json.RawMessage(`{"cwd":"` + elsewhere + `"}`)}}},
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_close", Input: json.RawMessage(`{"agent_id":"` + rep.AgentID + `"}`)}}},
		fakemodel.Reply{Text: "Refused twice."},
	)
	ran, err := fb.f.Run(t.Context(), schemas.RunRequest{AgentID: rep.AgentID, Text: "Open one elsewhere, then close yourself.", Timeout: 60})
	if err != nil || ran.Text != "Refused twice." {
		t.Errorf("run: %+v %v", ran, err)
	}
	reqs := fake.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the model was asked %d times, with these tool results: %s\nthe door saw: %s", len(reqs), toolResults(reqs), mustJSON(door.toolCalls()))
	}
	for _, name := range []string{"agent_open", "agent_close"} {
		if !slices.Contains(reqs[0].Tools, schemas.MCPToolPrefix+name) {
			t.Errorf("the CLI did not offer %s: %v", name, reqs[0].Tools)
		}
	}
	wants := []struct{ tool, refusal string }{
		{"agent_open", "agent_open refused: path is outside this agent's workspace: " + elsewhere},
		{"agent_close", "agent_close refused: denied by this agent's policy (agent_close)"},
	}
	calls := door.toolCalls()
	if len(calls) != len(wants) {
		t.Fatalf("the door saw these tool calls: %s", mustJSON(calls))
	}
	for i, w := range wants {
		c := calls[i]
		if c.Tool != w.tool || c.AgentID != rep.AgentID || !strings.Contains(c.Reply, w.refusal) || !strings.Contains(c.Reply, `"isError":true`) {
			t.Errorf("door call %d: %s; want %s from %s refused with %q", i, mustJSON(c), w.tool, rep.AgentID, w.refusal)
		}
		got := reqs[i+1].ToolResults
		if len(got) != 1 || got[0].Name != schemas.MCPToolPrefix+w.tool || !got[0].IsError || got[0].Content != w.refusal {
			t.Errorf("%s's result to the model: %+v, want the door's refusal %q", w.tool, got, w.refusal)
		}
	}
	recs, err := fb.f.List(t.Context())
	if err != nil || len(recs) != 1 || recs[0].Status == schemas.StatusDead {
		t.Errorf("after the refused calls: %s (%v)", mustJSON(recs), err)
	}
}

// toolResults summarises what the CLI sent back to the model.
func toolResults(reqs []fakemodel.Request) string {
	var out [][]fakemodel.ToolResult
	for _, r := range reqs {
		out = append(out, r.ToolResults)
	}
	return mustJSON(out)
}

// doorCall is one tools/call the MCP endpoint received, with the agent id
// header it carried and the endpoint's raw answer.
type doorCall struct {
	Tool    string
	AgentID string
	Reply   string
	reply   *bytes.Buffer
}

// doorLog records the tools/call requests that reach the MCP endpoint.
type doorLog struct {
	mu    sync.Mutex
	calls []*doorCall
}

func (d *doorLog) toolCalls() []doorCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]doorCall, len(d.calls))
	for i, c := range d.calls {
		out[i] = doorCall{Tool: c.Tool, AgentID: c.AgentID, Reply: c.reply.String()}
	}
	return out
}

// wrap records each tools/call and tees its answer, then serves it with h.
func (d *doorLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" {
			h.ServeHTTP(w, r)
			return
		}
		c := &doorCall{Tool: msg.Params.Name, AgentID: r.Header.Get(schemas.AgentIDHeader), reply: &bytes.Buffer{}}
		tw := &teeWriter{ResponseWriter: w, mu: &d.mu, buf: c.reply}
		d.mu.Lock()
		d.calls = append(d.calls, c)
		d.mu.Unlock()
		h.ServeHTTP(tw, r)
	})
}

// teeWriter copies what is written to the client.
type teeWriter struct {
	http.ResponseWriter
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	return w.ResponseWriter.Write(p)
}

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// startRecordedFabric is startFabric with the MCP endpoint's handler, the
// one ListenHTTP serves, behind a recorder of the tool calls it receives.
func startRecordedFabric(t *testing.T) (*fabric, *doorLog) {
	t.Helper()
	b := natstest.Start(t)
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := bridge.NewMCP(bridge.MCPConfig{Client: f})
	door := &doorLog{}
	mux := http.NewServeMux()
	mux.Handle(bridge.MCPPath, door.wrap(m.HTTPHandler(t.Context(), bridge.HTTPConfig{})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &fabric{t: t, b: b, f: f, url: srv.URL + bridge.MCPPath}, door
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
