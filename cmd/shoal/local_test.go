package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node whose VMLX_HOST serves MLX models advertises them; agent_open
// with vmlx:<tag> is placed on it and not on a node without them, and
// the agent answers through that node. A tag no node serves is refused
// with every node's reason.
func TestVMLXPlacedWhereTheModelIs(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	mlx := fakemodel.Start(t, fakemodel.Config{MLX: true, Models: []string{"mlx-community/qwen3-8b"}})
	mlx.Script(fakemodel.Reply{Thinking: "short", Text: "hello from mlx"})
	p.nodeWith("mac", []string{"VMLX_HOST=" + mlx.URL(), "OLLAMA_HOST=127.0.0.1:1"})
	p.nodeWith("linux", []string{"VMLX_HOST=127.0.0.1:1", "OLLAMA_HOST=127.0.0.1:1"})

	var listed schemas.NodesReply
	poll.Until(t, 30*time.Second, "the mac node advertises its MLX model", func() bool {
		code, out, _ := p.shoal("nodes", "--json")
		if code != 0 || json.Unmarshal([]byte(out), &listed) != nil {
			return false
		}
		schematest.Control(t, "nodes_reply", []byte(out))
		for _, n := range listed.Nodes {
			for _, b := range n.Backends {
				if n.Name == "mac" && b.Kind == "vmlx" && b.Ready && slices.Contains(b.Models, "mlx-community/qwen3-8b") {
					return true
				}
			}
		}
		return false
	})
	// agent_open over MCP, as Claude Code would call it.
	cmd := exec.Command(os.Args[0], "mcp", "--nats", p.url)
	cmd.Env = baseEnv(t.TempDir())
	c := mcp.NewClient(&mcp.Implementation{Name: "placement-test", Version: "1"}, nil)
	sess, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v", err)
	}
	defer sess.Close()
	for range 3 {
		res, err := sess.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_open", Arguments: map[string]any{
			"cwd": t.TempDir(), "model": "vmlx:mlx-community/qwen3-8b"}})
		if err != nil || res.IsError {
			t.Fatalf("agent_open: %v %+v", err, res)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		schematest.Control(t, "open_reply", []byte(text))
		var open schemas.OpenReply
		if err := json.Unmarshal([]byte(text), &open); err != nil || open.Node != "mac" {
			t.Fatalf("agent_open placed %+v (%v), want node mac", open, err)
		}
		p.must("close", open.AgentID)
	}
	id, _ := p.openOn("--model", "vmlx:mlx-community/qwen3-8b")
	if got := p.must("run", id, "say", "hello"); got != "hello from mlx" {
		t.Fatalf("run printed %q", got)
	}
	code, _, errOut := p.shoal("open", "--model", "vmlx:absent-model", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "mac") || !strings.Contains(errOut, "linux") {
		t.Fatalf("open of a model nobody serves: %d %s", code, errOut)
	}
}
