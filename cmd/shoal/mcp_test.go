package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal mcp serves the tools over stdio to an MCP client (here the
// official Go SDK's client, which spawns it the way Claude Code would).
func TestMCPOverStdio(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	cmd := exec.Command(os.Args[0], "mcp", "--nats", b.ClientURL())
	cmd.Env = baseEnv(t.TempDir())
	c := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v", err)
	}
	defer s.Close()
	tools, err := s.ListTools(t.Context(), nil)
	if err != nil || len(tools.Tools) != len(schemas.ToolAccess) {
		t.Fatalf("tools over stdio: %d %v", len(tools.Tools), err)
	}
	// shoal mcp --help names every tool it serves.
	_, help, _ := runShoal(t, t.TempDir(), nil, "mcp", "--help")
	for _, tool := range tools.Tools {
		if !strings.Contains(help, tool.Name) {
			t.Errorf("shoal mcp --help does not name %s", tool.Name)
		}
	}
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_list"})
	if err != nil || res.IsError {
		t.Fatalf("agent_list: %v %+v", err, res)
	}
	var list schemas.ListReply
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &list); err != nil || list.Agents == nil {
		t.Fatalf("agent_list returned %v %v", list, err)
	}
	res, _ = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_send", Arguments: map[string]any{"agent_id": "x"}})
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "Missing required parameter(s): text") {
		t.Fatalf("validation over stdio: %+v", res)
	}
}

// A script that writes its calls to shoal mcp and closes the pipe gets
// every answer before shoal mcp ends: a run still going when the input
// ends is answered, not cancelled.
func TestMCPOverStdioAnswersWhatItReadBeforeItsInputEnded(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", t.TempDir())
	c.fake.Script(fakemodel.Reply{Text: "answered after the pipe closed", Delay: 100 * time.Millisecond})
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"pipe","version":"0"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"run","method":"tools/call","params":{"name":"agent_run","arguments":{"agent_id":"` + id + `","text":"Answer.","timeout":60}}}`,
	}, "\n") + "\n"
	cmd := exec.Command(os.Args[0], "mcp", "--nats", c.url)
	cmd.Env = baseEnv(t.TempDir())
	cmd.Stdin = strings.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("shoal mcp with its input closed: %v\n%s", err, out)
	}
	var answered bool
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m struct {
			ID     any `json:"id"`
			Result struct {
				Content []struct{ Text string }
			}
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.ID == "run" {
			answered = len(m.Result.Content) > 0 && strings.Contains(m.Result.Content[0].Text, "answered after the pipe closed")
		}
	}
	if !answered {
		t.Errorf("the run written before the input closed was not answered with its text; shoal mcp wrote:\n%s", out)
	}
}
