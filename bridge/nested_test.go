package bridge_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// A real claude agent under the notebook preset, its recursion guard
// lifted, opens agents through Shoal's tools: a bypass child is refused,
// and so is a child whose directory is a symlink out of the parent's; a
// notebook child in a subdirectory opens, recorded with its parent and
// depth, no wider than the parent.
func TestRealClaudeChildNoWiderThanItsParent(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb, _ := startRecordedFabric(t)
	fb.startNode(fake)
	cwd, outside := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(cwd, "sub"), 0o755)
	if err := os.Symlink(outside, filepath.Join(cwd, "out")); err != nil {
		t.Fatal(err)
	}
	open := func(args string) fakemodel.Reply {
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_open", Input: json.RawMessage(args)}}}
	}
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	fake.Script(
		open(`{"cwd":`+quote(cwd)+`,"permission":"bypass"}`),
		open(`{"cwd":`+quote(filepath.Join(cwd, "out"))+`,"permission":"notebook"}`),
		open(`{"cwd":`+quote(filepath.Join(cwd, "sub"))+`,"permission":"notebook","id":"kid"}`),
		fakemodel.Reply{Text: "Tried three."},
	)
	none := []string{}
	rep, err := fb.f.Open(t.Context(), schemas.OpenRequest{CWD: cwd, Node: "n1", Permission: "notebook", DisallowedTools: &none})
	if err != nil {
		t.Fatal(err)
	}
	before := len(fake.Requests())
	ran, err := fb.f.Run(t.Context(), schemas.RunRequest{AgentID: rep.AgentID, Text: "Open agents.", Timeout: 120})
	if err != nil || ran.Text != "Tried three." {
		t.Fatalf("run: %+v %v", ran, err)
	}
	reqs := fake.Requests()[before:]
	if len(reqs) != 4 {
		t.Fatalf("the model was asked %d times: %s", len(reqs), toolResults(reqs))
	}
	result := func(i int) fakemodel.ToolResult {
		t.Helper()
		if len(reqs[i].ToolResults) != 1 {
			t.Fatalf("request %d carries %d tool results", i, len(reqs[i].ToolResults))
		}
		return reqs[i].ToolResults[0]
	}
	if r := result(1); !r.IsError || !strings.Contains(r.Content, "a child may not exceed its parent: preset bypass is wider than this agent's (notebook)") {
		t.Errorf("the bypass child: %+v", r)
	}
	if r := result(2); !r.IsError || !strings.Contains(r.Content, "path is outside this agent's workspace") {
		t.Errorf("the child through a symlink: %+v", r)
	}
	if r := result(3); r.IsError || !strings.Contains(r.Content, `"agent_id":"kid"`) {
		t.Fatalf("the permitted child: %+v", r)
	}
	kid, err := fb.f.Record(t.Context(), "kid")
	if err != nil {
		t.Fatal(err)
	}
	parent, _ := fb.f.Record(t.Context(), rep.AgentID)
	real, _ := filepath.EvalSymlinks(filepath.Join(cwd, "sub"))
	if kid.Parent != rep.AgentID || kid.Depth != 1 || kid.Policy == nil || kid.Policy.Preset != schemas.PresetNotebook || kid.CWD != real {
		t.Fatalf("the child's record: %s", mustJSON(kid))
	}
	for _, d := range parent.Policy.DisallowedTools {
		if !slices.Contains(kid.Policy.DisallowedTools, d) {
			t.Errorf("the child may call %s, which its parent may not", d)
		}
	}
	recs, _ := fb.f.List(t.Context())
	if len(recs) != 2 {
		t.Errorf("%d agents, want the parent and one child: %s", len(recs), mustJSON(recs))
	}
}
