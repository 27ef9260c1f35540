package bridge_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// With only, the real claude CLI offers the model exactly the agent's
// allowlist: the built-in tools it names and, from Shoal's MCP server
// (loaded before the first request), the Shoal tools it names, which
// work through the door; nothing else, built in or from Shoal.
func TestRealClaudeOnly(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb, door := startRecordedFabric(t)
	fb.startNode(fake)
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_nodes", Input: json.RawMessage(`{}`)}}},
		fakemodel.Reply{Text: "Listed."},
	)
	rep, err := fb.f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir(), Node: "n1", Only: true,
		AllowedTools: []string{"Read", schemas.MCPToolPrefix + "agent_nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	ran, err := fb.f.Run(t.Context(), schemas.RunRequest{AgentID: rep.AgentID, Text: "List the agents.", Timeout: 60})
	if err != nil || ran.Text != "Listed." {
		t.Fatalf("run: %+v %v", ran, err)
	}
	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the model was asked %d times: %s", len(reqs), toolResults(reqs))
	}
	offered := reqs[0].Tools
	for _, want := range []string{"Read", schemas.MCPToolPrefix + "agent_nodes"} {
		if !slices.Contains(offered, want) {
			t.Errorf("the CLI did not offer %s: %v", want, offered)
		}
	}
	for _, tool := range offered {
		if !slices.Contains([]string{"Read", "ToolSearch", schemas.MCPToolPrefix + "agent_nodes"}, tool) {
			t.Errorf("the CLI offered %s, which the allowlist does not name (offered %v)", tool, offered)
		}
	}
	calls := door.toolCalls()
	if len(calls) != 1 || calls[0].Tool != "agent_nodes" || calls[0].AgentID != rep.AgentID {
		t.Fatalf("the door saw %s; want one agent_nodes from %s", mustJSON(calls), rep.AgentID)
	}
	if got := reqs[1].ToolResults; len(got) != 1 || got[0].IsError {
		t.Errorf("agent_nodes's result to the model: %+v", got)
	}
}

// A specialist with no allowed_tools may call nothing: the real claude
// CLI offers the model no tool at all, neither its own (cron, tasks, web
// fetch, skills) nor Shoal's. With only and ["Read"], it offers exactly
// Read.
func TestRealClaudeExactToolSets(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb, _ := startRecordedFabric(t)
	fb.startNode(fake)
	for _, c := range []struct {
		name string
		req  schemas.OpenRequest
		want []string
	}{
		{"specialist, no tools", schemas.OpenRequest{Permission: "specialist"}, nil},
		{"only Read", schemas.OpenRequest{Only: true, AllowedTools: []string{"Read"}}, []string{"Read"}},
	} {
		fake.Script(fakemodel.Reply{Text: "Done."})
		before := len(fake.Requests())
		c.req.CWD, c.req.Node = t.TempDir(), "n1"
		rep, err := fb.f.Open(t.Context(), c.req)
		if err != nil {
			t.Fatalf("%s: open: %v", c.name, err)
		}
		if ran, err := fb.f.Run(t.Context(), schemas.RunRequest{AgentID: rep.AgentID, Text: "Go.", Timeout: 60}); err != nil || ran.Text != "Done." {
			t.Fatalf("%s: run: %+v %v", c.name, ran, err)
		}
		reqs := fake.Requests()[before:]
		if len(reqs) != 1 {
			t.Fatalf("%s: the model was asked %d times", c.name, len(reqs))
		}
		if got := reqs[0].Tools; !slices.Equal(got, c.want) {
			t.Errorf("%s: the CLI offered %v, want %v", c.name, got, c.want)
		}
	}
}
