package bridge_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// The real claude CLI, given the MCP config its node generated, calls
// agent_list through the door and is refused agent_open under the default
// recursion guard. The lab preset grants Shoal's MCP server, as a claude
// agent in -p mode may call MCP tools only when they are allowed.
func TestRealClaudeThroughTheDoor(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	cwd := t.TempDir()
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_list", Input: json.RawMessage(`{}`)}}},
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
		t.Fatalf("the model was asked %d times: %s", len(reqs), mustJSON(reqs))
	}
	offered := strings.Join(reqs[0].Tools, " ")
	if !strings.Contains(offered, schemas.MCPToolPrefix+"agent_list") {
		t.Errorf("the CLI did not offer Shoal's agent_list; it offered: %s", offered)
	}
	list := reqs[1].ToolResults
	if len(list) != 1 || list[0].IsError || !strings.Contains(list[0].Content, `"agents":[`) || !strings.Contains(list[0].Content, rep.AgentID) {
		t.Errorf("agent_list through the door: %+v", list)
	}
	open := reqs[2].ToolResults
	if len(open) != 1 || !open[0].IsError {
		t.Errorf("agent_open was not refused: %+v", open)
	}
	t.Logf("agent_open was refused with: %s", open[0].Content)
	// No second agent exists.
	recs, _ := fb.f.List(t.Context())
	if len(recs) != 1 {
		t.Errorf("%d agents after a refused agent_open", len(recs))
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
