package bridge_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/schemas"
)

// Over MCP, a person opens a real claude agent on a repository of the
// endpoint's machine (agent_open with repo), its Bash tool adds a file,
// agent_diff shows it and agent_fetch makes branch shoal/<id> with it, the
// checkout untouched. An observer reads the diff but fetches nothing; an
// agent may neither open on a repository nor fetch; bad arguments are
// refused in a line each.
func TestMCPWorksOnARepository(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{Token: "full", ObserverToken: "eyes"})
	fb.startNode(fake)
	repo := filepath.Join(t.TempDir(), "repo")
	gittest.Git(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	head := gittest.Git(t, repo, "rev-parse", "HEAD")

	person := fb.client(map[string]string{"Authorization": "Bearer full"})
	var opened schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": repo, "repo": true, "permission": "bypass"}, &opened)
	var rec schemas.AgentRecord
	ok(t, person, "agent_status", map[string]any{"agent_id": opened.AgentID}, &rec)
	if rec.Workspace == nil || rec.Workspace.Base != head || rec.Workspace.Branch != "shoal/"+opened.AgentID || rec.CWD == repo {
		t.Fatalf("the agent's record: %+v", rec)
	}
	in, _ := json.Marshal(map[string]string{"command": "echo from-mcp > mcp.txt", "description": "write"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	var ran schemas.RunReply
	ok(t, person, "agent_run", map[string]any{"agent_id": opened.AgentID, "text": "Write mcp.txt."}, &ran)
	if ran.Text != "Written." {
		t.Fatalf("the run: %+v", ran)
	}

	observer := fb.client(map[string]string{"Authorization": "Bearer eyes"})
	var diff schemas.DiffReply
	ok(t, observer, "agent_diff", map[string]any{"agent_id": opened.AgentID}, &diff)
	if diff.Files != 1 || diff.Base != head || !strings.Contains(diff.Diff, "+from-mcp") || !strings.Contains(diff.Diff, "mcp.txt") {
		t.Errorf("agent_diff: %+v", diff)
	}
	ok(t, observer, "agent_diff", map[string]any{"agent_id": opened.AgentID, "stat": true}, &diff)
	if !strings.Contains(diff.Diff, "mcp.txt | 1 +") {
		t.Errorf("agent_diff with stat: %q", diff.Diff)
	}
	if text, isErr := call(t, observer, "agent_fetch", map[string]any{"agent_id": opened.AgentID}); !isErr || !strings.Contains(text, "rule observer") {
		t.Errorf("an observer's agent_fetch: %q", text)
	}

	var got schemas.FetchReply
	ok(t, person, "agent_fetch", map[string]any{"agent_id": opened.AgentID}, &got)
	if got.Branch != "shoal/"+opened.AgentID || got.Into != repo || got.Files != 1 || got.Base != head {
		t.Errorf("agent_fetch: %+v", got)
	}
	if file := gittest.Git(t, repo, "show", got.Branch+":mcp.txt"); file != "from-mcp" {
		t.Errorf("mcp.txt on %s: %q", got.Branch, file)
	}
	if gittest.Git(t, repo, "rev-parse", "HEAD") != head || gittest.Git(t, repo, "status", "--porcelain") != "" {
		t.Error("the fetch touched the checkout")
	}

	// An agent, even one with every tool, neither reads a repository of
	// this machine nor writes into one.
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "a", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(t.TempDir())})
	agent := fb.client(map[string]string{schemas.AgentIDHeader: "a", "Authorization": "Bearer full"})
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"agent_open", map[string]any{"cwd": repo, "repo": true}},
		{"agent_fetch", map[string]any{"agent_id": opened.AgentID}},
	} {
		if text, isErr := call(t, agent, c.tool, c.args); !isErr || !strings.Contains(text, c.tool+" refused: agent a may not") || !strings.Contains(text, "rule callers-files") {
			t.Errorf("an agent's %s: %q", c.tool, text)
		}
	}

	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"agent_open", map[string]any{"cwd": "repo", "repo": true}, `cwd "repo" is not an absolute path`},
		{"agent_open", map[string]any{"cwd": t.TempDir(), "repo": true}, "not a git repository"},
		{"agent_open", map[string]any{"cwd": repo, "ref": "main"}, "ref and with_changes go with repo: true"},
		{"agent_open", map[string]any{"cwd": repo, "repo": true, "ref": "no-such-ref"}, "no-such-ref"},
		{"agent_fetch", map[string]any{"agent_id": opened.AgentID, "into": "repo"}, `into "repo" is not an absolute path`},
		{"agent_diff", map[string]any{"agent_id": "nobody"}, "nobody"},
	} {
		if text, isErr := call(t, person, c.tool, c.args); !isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: %q, want an error with %q", c.tool, c.args, text, c.want)
		}
	}
}
