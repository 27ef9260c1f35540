package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
)

// A node that knows no MCP endpoint (started without --mcp-url or node
// credentials) ran the claude CLI without --strict-mcp-config, and the CLI
// loaded the MCP servers of the user it runs as: after the README's own
// `claude mcp add --scope user … shoal …`, its agents reached the
// coordinator's endpoint as no agent at all, past every rule the door
// holds agents to. The CLI is always held to the MCP servers Shoal
// gives it: here none, and the user's server hears nothing.
func TestAgentLoadsNoMCPServerOfTheNodesUser(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	users := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "not here", http.StatusNotFound)
	}))
	defer users.Close()
	c := startCoordinator(t, nil, "--no-node")
	home := filepath.Join(t.TempDir(), "n1")
	claudeHome := filepath.Join(home, "claude")
	if err := os.MkdirAll(claudeHome, 0o700); err != nil {
		t.Fatal(err)
	}
	user := `{"mcpServers":{"shoal":{"type":"http","url":"` + users.URL + `/mcp"}}}`
	if err := os.WriteFile(filepath.Join(claudeHome, ".claude.json"), []byte(user), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(peers.ClaudeEnv(claudeHome, c.fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	env = append(env, c.client...)
	n := startShoal(t, home, env, "node", "--name", "n1", "--claude", peers.Claude.Command(t)[0])
	n.waitLine("shoal: node n1 joined")
	id := c.must("open", "--node", "n1", t.TempDir())
	c.fake.Script(fakemodel.Reply{Text: "done"})
	if out := c.must("run", id, "Go."); out != "done" {
		t.Fatalf("the turn printed %q", out)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the agent's CLI reached the MCP server of the node's user %d times", n)
	}
}
