package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// With --mcp-token, a lab agent reaches Shoal's tools through a token of
// its own: the real claude CLI calls agent_status and gets the record. The
// coordinator's token is in no file the node or the agent wrote.
func TestAgentsReachTheMCPEndpointWithTheirOwnToken(t *testing.T) {
	t.Parallel()
	const token = "op-token-7c1e5d"
	c := startCoordinator(t, nil, "--mcp-token", token)
	fake, must, dir := c.fake, c.must, c.dir
	cwd := t.TempDir()
	id := must("open", "--id", "labrat", "--permission", "lab", "--allow-nested", cwd)
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_status", Input: json.RawMessage(`{"agent_id":"labrat"}`)}}},
		fakemodel.Reply{Text: "Looked myself up."},
	)
	if out := must("run", id, "Who are you?"); out != "Looked myself up." {
		t.Fatalf("run: %q", out)
	}
	reqs := fake.Requests()
	last := reqs[len(reqs)-1].ToolResults
	if len(last) != 1 || last[0].IsError || !strings.Contains(last[0].Content, `"id":"labrat"`) {
		t.Fatalf("agent_status through the agent's token: %+v", last)
	}
	// Nowhere on disk: not under the coordinator's and node's home, not in
	// the agent's directory, not in the CLI's home.
	for _, root := range []string{dir, cwd} {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !d.Type().IsRegular() {
				return nil
			}
			if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), token) {
				t.Errorf("%s holds the coordinator's MCP token", path)
			}
			return nil
		})
	}
}

// An agent's environment holds none of its node's Shoal settings: a
// coordinator given its MCP token in SHOAL_MCP_TOKEN starts an agent
// whose own Bash tool finds neither the token nor any SHOAL_ variable but
// those the node gives the agent itself.
func TestAgentsGetNoneOfTheNodesShoalVariables(t *testing.T) {
	t.Parallel()
	const token = "op-token-from-the-environment-4d2a"
	c := startCoordinator(t, []string{"SHOAL_MCP_TOKEN=" + token, "SHOAL_MCP_OBSERVER_TOKEN=observer-from-the-environment"})
	fake, must, client := c.fake, c.must, c.client
	in, _ := json.Marshal(map[string]string{"command": "env | sort", "description": "look around"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Looked."})
	id := must("open", "--permission", "bypass", "--reach", "read", t.TempDir())
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(must("status", "--json", id)), &rec); err != nil || rec.Reach != schemas.ReachRead {
		t.Errorf("the record of an agent opened with --reach read: %+v %v", rec, err)
	}
	if code, _, errOut := runShoal(t, t.TempDir(), client, "open", "--reach", "everything", t.TempDir()); code != exitUsage || !strings.Contains(errOut, `unknown reach "everything" (want own, read or all)`) {
		t.Errorf("open --reach everything: exit %d, %q", code, errOut)
	}
	if out := must("run", id, "What is in your environment?"); out != "Looked." {
		t.Fatalf("run: %q", out)
	}
	reqs := fake.Requests()
	got := reqs[len(reqs)-1].ToolResults
	if len(got) != 1 || got[0].IsError {
		t.Fatalf("the Bash tool: %+v", got)
	}
	out := got[0].Content
	if strings.Contains(out, token) || strings.Contains(out, "observer-from-the-environment") {
		t.Errorf("the agent's environment holds the node's tokens:\n%s", out)
	}
	allowed := map[string]bool{"SHOAL_AGENT_ID": true, "SHOAL_NODE": true, "SHOAL_PARENT_PID": true, "SHOAL_AGENT_LIFE": true, "SHOAL_PROC": true}
	for _, line := range strings.Split(out, "\n") {
		name, _, _ := strings.Cut(line, "=")
		if strings.HasPrefix(name, "SHOAL_") && !allowed[name] {
			t.Errorf("the agent's environment holds the node's %s", line)
		}
	}
	if !strings.Contains(out, "SHOAL_AGENT_ID="+id) {
		t.Errorf("the agent's own id is not in its environment:\n%s", out)
	}
}

// Under --auth, a node on another machine (its own credentials, no MCP
// setting of its own) is given the way to the coordinator's MCP endpoint
// with them: its agent's MCP call succeeds as that agent, and a call
// beyond the agent's rights (driving an agent it did not open) is refused.
// Neither the endpoint's token nor a way to it is on the node's disk.
func TestRemoteNodeAgentsReachMCPUnderAuth(t *testing.T) {
	t.Parallel()
	const token = "op-token-remote-9b4e"
	p := startAuthPool(t, "client", "cli", "--mcp-token", token)
	fake, home := p.fake, p.nodeHome()
	must := func(args ...string) string { t.Helper(); return p.must(t, args...) }
	victim := must("open", "--id", "victim", "--permission", "bypass", t.TempDir())
	tool := func(name, args string) fakemodel.Reply {
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + name, Input: json.RawMessage(args)}}}
	}
	fake.Script(
		tool("agent_status", `{"agent_id":"remote"}`),
		tool("agent_run", `{"agent_id":"`+victim+`","text":"cat ~/.ssh/id_rsa"}`),
		fakemodel.Reply{Text: "Tried both."},
	)
	cwd := t.TempDir()
	id := must("open", "--id", "remote", "--permission", "lab", "--allow-nested", cwd)
	if out := must("run", id, "Look yourself up, then drive the victim."); out != "Tried both." {
		t.Fatalf("run: %q", out)
	}
	reqs := fake.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the model was asked %d times, want 3", len(reqs))
	}
	status, run := reqs[1].ToolResults, reqs[2].ToolResults
	if len(status) != 1 || status[0].IsError || !strings.Contains(status[0].Content, `"id":"remote"`) || !strings.Contains(status[0].Content, `"node":"far"`) {
		t.Errorf("agent_status as the remote agent: %+v", status)
	}
	if len(run) != 1 || !run[0].IsError || !strings.Contains(run[0].Content, "agent remote may not") || !strings.Contains(run[0].Content, "rule subtree") {
		t.Errorf("agent_run on an agent it did not open: %+v", run)
	}
	var rec schemas.AgentRecord
	json.Unmarshal([]byte(must("status", "--json", victim)), &rec)
	if rec.Turn != 0 {
		t.Errorf("the victim ran a turn: %+v", rec)
	}
	filepath.WalkDir(home, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), token) {
			t.Errorf("%s on the node holds the coordinator's MCP token", path)
		}
		return nil
	})
}
