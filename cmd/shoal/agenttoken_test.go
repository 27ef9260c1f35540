package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/schemas"
)

// With --mcp-token, a lab agent reaches Shoal's tools through a token of
// its own: the real claude CLI calls agent_status and gets the record. The
// coordinator's token is in no file the node or the agent wrote.
func TestAgentsReachTheMCPEndpointWithTheirOwnToken(t *testing.T) {
	t.Parallel()
	const token = "op-token-7c1e5d"
	fake := fakemodel.Start(t, fakemodel.Config{})
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus", "--mcp-token", token,
		"--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: %s", args, errOut)
		}
		return strings.TrimSpace(out)
	}
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
