package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
)

// A node with credentials takes the coordinator's MCP grant again at each
// open: after the coordinator comes back with another --mcp-token (or
// with one where it had none, or its endpoint on another port), the
// node, never restarted, opens a
// local-model agent whose Shoal tools answer under the new token. An
// agent opened before holds a token made from the old one: its tool call
// is refused saying to open it again, and once closed and opened again
// its tools answer.
func TestANodeTakesTheCoordinatorsNewMCPToken(t *testing.T) {
	t.Parallel()
	const second = "second-token-9d3e7b"
	for _, c := range []struct {
		name, first string
		moves       bool // the endpoint comes back on another port
	}{
		{"another token", "first-token-2f8c1a", false},
		{"a token where it had none", "", false},
		{"another address", second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Fixed ports, for the coordinator to come back where it was,
			// its endpoint too unless it moves.
			up := []string{"--port", strconv.Itoa(freePort(t))}
			if !c.moves {
				up = append(up, "--mcp-listen", "127.0.0.1:"+strconv.Itoa(freePort(t)))
			}
			if c.first != "" {
				up = append(up, "--mcp-token", c.first)
			}
			p := startAuthPool(t, "client", "cli", up...)
			// The node runs local-model agents too, whose tools the node
			// connects to as they open.
			p.node.stop(syscall.SIGTERM)
			home := p.nodeHome()
			env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), p.fake.URL()), "XDG_CACHE_HOME="+home+"/cache", "OLLAMA_HOST="+p.fake.URL())
			p.node = startShoal(t, home, env, "node", "--nats", p.url, "--creds", p.creds["far"], "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms")
			p.node.waitLine("shoal: node far joined")

			openArgs := func(id string) []string {
				return []string{"open", "--id", id, "--model", "ollama:fake-model", "--permission", "lab", "--allow-nested", t.TempDir()}
			}
			open := func(id string) { t.Helper(); p.must(t, openArgs(id)...) }
			// lookup has agent id look itself up with agent_status and
			// returns what the tool answered.
			lookup := func(id string) string {
				t.Helper()
				p.fake.Script(
					fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "agent_status", Input: json.RawMessage(`{"agent_id":"` + id + `"}`)}}},
					fakemodel.Reply{Text: "Looked."},
				)
				if out := p.must(t, "run", id, "Look yourself up."); out != "Looked." {
					t.Fatalf("run %s: %q", id, out)
				}
				reqs := p.fake.Requests()
				got := reqs[len(reqs)-1].ToolResults
				if len(got) != 1 {
					t.Fatalf("run %s: tool results %+v", id, got)
				}
				return got[0].Content
			}
			open("before")
			if c.first != "" {
				if got := lookup("before"); !strings.Contains(got, `"id":"before"`) {
					t.Fatalf("agent_status before the restart: %q", got)
				}
			}

			args := slices.Clone(p.upArgs)
			if i := slices.Index(args, "--mcp-token"); i >= 0 {
				args = slices.Delete(args, i, i+2)
			}
			p.upArgs = append(args, "--mcp-token", second)
			p.restartUp(t, syscall.SIGTERM)
			// The node is back once an open reaches it; the open must
			// then succeed.
			poll.Until(t, 30*time.Second, "an open reaches node far again", func() bool {
				code, out, errOut := runShoal(t, t.TempDir(), p.as, openArgs("after")...)
				if code == exitUnavailable && strings.Contains(errOut, "not reachable") {
					return false
				}
				if code != 0 {
					t.Fatalf("open after the restart: exit %d: %s%s", code, out, errOut)
				}
				return true
			})
			if got := lookup("after"); !strings.Contains(got, `"id":"after"`) {
				t.Fatalf("agent_status of an agent opened after the restart: %q", got)
			}
			if c.first != "" {
				// Its token was made from the old one.
				if got := lookup("before"); !strings.Contains(got, "open it again") {
					t.Errorf("agent_status of an agent opened before the restart: %q, want it to say to open it again", got)
				}
			}
			// An MCP server that does not answer as the agent opens is not
			// a wrong request: the open is unavailable.
			config := filepath.Join(t.TempDir(), "mcp.json")
			b, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"gone": map[string]any{"type": "http", "url": "http://127.0.0.1:" + strconv.Itoa(freePort(t)) + "/mcp"}}})
			if err := os.WriteFile(config, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if code, _, errOut := runShoal(t, t.TempDir(), p.as, append(openArgs("unreached"), "--mcp-config", config)...); code != exitUnavailable || !strings.Contains(errOut, `MCP server "gone"`) {
				t.Errorf("open with an MCP server that does not answer: exit %d, %q; want %d naming it", code, errOut, exitUnavailable)
			}
			p.must(t, "close", "before")
			open("before")
			if got := lookup("before"); !strings.Contains(got, `"id":"before"`) {
				t.Fatalf("agent_status of an agent opened again after the restart: %q", got)
			}
		})
	}
}
