package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node/proc"
)

// mcpServerMode, when set in the environment, makes this test binary a
// stdio MCP server (what a local-model agent's mcp_config names) that
// starts a sleeper in a session of its own, as a tool a server runs
// would be.
const mcpServerMode = "SHOAL_TEST_MCP_SERVER"

func runTestMCPServer() {
	sleeper := exec.Command("sleep", "777")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleeper.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := server.NewMCPServer("contain-test", "1")
	s.AddTool(mcp.NewTool("ping", mcp.WithDescription("Answers pong.")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("pong"), nil
	})
	if err := server.ServeStdio(s); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(0)
}

// lifeProcesses lists the processes that carry an agent's life token.
func lifeProcesses(token string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, []byte("\x00"+proc.LifeEnv+"="+token+"\x00")) && !bytes.HasPrefix(env, []byte(proc.LifeEnv+"="+token+"\x00")) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, e.Name()+" "+strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
	}
	return out
}

// lifeToken reads an agent's life token from its node's pids.json.
func lifeToken(t *testing.T, dir, id string) string {
	t.Helper()
	var pids map[string]struct {
		Life string `json:"life"`
	}
	var token string
	poll.Until(t, 30*time.Second, "agent "+id+" in pids.json", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "pids.json"))
		if err != nil || json.Unmarshal(b, &pids) != nil {
			return false
		}
		token = pids[id].Life
		return token != ""
	})
	return token
}

// Everything an agent starts ends when its node is killed with SIGKILL,
// within seconds and without a restart: the real claude CLI's Bash tool,
// opencode's shell tool, and a local-model agent's stdio MCP server with
// what it started, each in a session of its own. And when the node's
// reaper is killed with it, the restarted node reaps what is left.
func TestKilledNodeLeavesNoAgentProcess(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(t *testing.T, p *pool, home string) (env, open []string, turn string, tool string)
	}{
		{"claude Bash", func(t *testing.T, p *pool, _ string) ([]string, []string, string, string) {
			p.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"sleep 777","description":"Wait"}`)}}})
			return nil, []string{"--permission", "bypass"}, "Wait a long time.", "sleep 777"
		}},
		{"opencode shell", func(t *testing.T, p *pool, home string) ([]string, []string, string, string) {
			fake := fakemodel.Start(t, fakemodel.Config{})
			fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: json.RawMessage(`{"command":"sleep 777","description":"Wait"}`)}}})
			env := peers.OpencodeEnv(t, filepath.Join(home, "oc"), fake.URL()+"/v1")
			return append(env, "SHOAL_OPENCODE="+peers.Opencode.Command(t)[0]), []string{"--model", "acp:opencode"}, "Wait a long time.", "sleep 777"
		}},
		{"ollama stdio MCP server", func(t *testing.T, p *pool, home string) ([]string, []string, string, string) {
			fake := fakemodel.Start(t, fakemodel.Config{})
			exe, _ := os.Executable()
			config := filepath.Join(home, "mcp.json")
			b, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"tools": map[string]any{
				"command": exe, "env": map[string]string{mcpServerMode: "1", "SHOAL_TEST_MAIN": "0"}}}})
			if err := os.WriteFile(config, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"OLLAMA_HOST=" + fake.URL()}, []string{"--model", "ollama:fake-model", "--mcp-config", config}, "", "sleep 777"
		}},
	}
	for _, c := range cases {
		for _, reaperToo := range []bool{false, true} {
			name := c.name
			if reaperToo {
				name += ", the reaper killed too"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				p := startPool(t)
				home := t.TempDir()
				env, open, turn, tool := c.setup(t, p, home)
				node, dir := "contain", filepath.Join(home, "node")
				n := p.nodeWith(node, env, "--dir", dir)
				id, _ := p.openOn(open...)
				if turn != "" {
					p.must("send", id, turn)
				}
				token := lifeToken(t, dir, id)
				poll.Until(t, 3*time.Minute, "the agent's "+tool+" runs", func() bool {
					return strings.Contains(strings.Join(lifeProcesses(token), "\n"), tool)
				})
				if reaperToo {
					// Frozen first, so the node cannot end what the dying
					// reaper leaves: both go as if at once.
					reaper := childWithArg(t, n.cmd.Process.Pid, proc.ReaperArg)
					syscall.Kill(n.cmd.Process.Pid, syscall.SIGSTOP)
					syscall.Kill(reaper, syscall.SIGKILL)
				}
				n.stop(syscall.SIGKILL)
				if !reaperToo {
					poll.Until(t, 5*time.Second, "no process of the agent's tree", func() bool { return len(lifeProcesses(token)) == 0 })
					return
				}
				if left := lifeProcesses(token); !strings.Contains(strings.Join(left, "\n"), tool) {
					t.Fatalf("with its reaper killed too, the agent left %q; the test needs the %s left behind to prove the reaping", left, tool)
				}
				p.nodeWith(node, env, "--dir", dir)
				poll.Until(t, 10*time.Second, "the restarted node reaps the agent's tree", func() bool { return len(lifeProcesses(token)) == 0 })
			})
		}
	}
}

// childWithArg finds the child of parent whose first argument is arg.
func childWithArg(t *testing.T, parent int, arg string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 && args[1] == arg {
			return pid
		}
	}
	t.Fatalf("process %d has no child run with %s", parent, arg)
	return 0
}
