package node_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// bash is a Bash tool call.
func bash(cmd string) fakemodel.Reply {
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
	return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
}

// The real claude CLI under bypass, sandboxed: its Bash tool cannot write
// outside the agent's directory nor read a secret there, not through a
// symlink in the directory either; the Write tool writes inside it; a
// daemon a tool forks is as confined and ends with the agent; the turn
// ends normally. The record and the life's first status say what the
// agent was confined to.
func TestRealClaudeSandboxed(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("the decoy secret"), 0o644)
	os.Symlink(outside, filepath.Join(cwd, "link"))
	write, _ := json.Marshal(map[string]string{"file_path": filepath.Join(cwd, "ok.txt"), "content": "written inside"})
	fake.Script(
		bash("echo x > "+filepath.Join(outside, "f")),
		bash("cat "+secret),
		bash("cat "+filepath.Join(cwd, "link", "secret")),
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Write", Input: write}}},
		bash("setsid sh -c 'sleep 1; echo y > "+filepath.Join(outside, "daemon")+"; exec sleep 611' > /dev/null 2>&1 < /dev/null & echo forked"),
		fakemodel.Reply{Text: "Tried everything."},
	)
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	yes := true
	id := f.open(schemas.OpenRequest{Permission: "bypass", Sandbox: &yes, CWD: cwd})
	rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Escape."})
	if err != nil || rep.Text != "Tried everything." || rep.StopReason != schemas.StopEndTurn {
		t.Fatalf("the turn: %+v %v", rep, err)
	}
	reqs := fake.Requests()
	if len(reqs) != 6 {
		t.Fatalf("the model was asked %d times", len(reqs))
	}
	result := func(i int) fakemodel.ToolResult {
		t.Helper()
		if len(reqs[i].ToolResults) != 1 {
			t.Fatalf("request %d has %d tool results", i, len(reqs[i].ToolResults))
		}
		return reqs[i].ToolResults[0]
	}
	for i, what := range map[int]string{1: "the write outside", 2: "the read of the secret", 3: "the read through the symlink"} {
		if r := result(i); !r.IsError || !strings.Contains(r.Content, "Permission denied") || strings.Contains(r.Content, "decoy") {
			t.Errorf("%s: %+v", what, r)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); !os.IsNotExist(err) {
		t.Errorf("the file outside exists: %v", err)
	}
	if r := result(4); r.IsError {
		t.Errorf("the write inside: %+v", r)
	}
	if b, err := os.ReadFile(filepath.Join(cwd, "ok.txt")); err != nil || string(b) != "written inside" {
		t.Errorf("ok.txt: %q %v", b, err)
	}
	if r := result(5); r.IsError || !strings.Contains(r.Content, "forked") {
		t.Errorf("the daemon: %+v", r)
	}
	daemon := 0
	eventually(t, 10*time.Second, "the daemon runs", func() bool {
		daemon = pidWithArg("611")
		return daemon > 0
	})
	if _, err := os.Stat(filepath.Join(outside, "daemon")); !os.IsNotExist(err) {
		t.Errorf("the daemon wrote outside: %v", err)
	}

	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || rec.Sandbox == nil || !strings.HasPrefix(rec.Sandbox.Kernel, "landlock ABI ") || !contains(rec.Sandbox.Writable, cwd) || rec.Sandbox.Proxy == "" {
		t.Fatalf("the record's sandbox: %s %v", mustJSON(rec.Sandbox), err)
	}
	var first *schemas.Event
	f.fabric.Replay(f.ctx(10*time.Second), []string{id}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		if ev, err := r.Event(); err == nil && first == nil {
			first = &ev
		}
		return nil
	})
	if st, ok := first.Payload.(schemas.Status); first == nil || !ok || st.Status != schemas.StatusIdle || st.Sandbox == nil || st.Sandbox.Kernel != rec.Sandbox.Kernel {
		t.Errorf("the first status: %+v", first)
	}

	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	eventually(t, 10*time.Second, "the daemon ends with the agent", func() bool { return pidWithArg("611") == 0 })
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// pidWithArg is a process whose command line has arg as its last word.
func pidWithArg(arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		parts := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(parts) == 2 && parts[0] == "sleep" && parts[1] == arg {
			return pid
		}
	}
	return 0
}
