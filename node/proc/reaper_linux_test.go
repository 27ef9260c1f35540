//go:build linux

package proc_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/proc"
)

// The claude CLI runs each Bash tool in a session and process group of
// its own. Held by the reaper, such a process still ends with the agent
// and with the node: when the node is killed with SIGKILL, within
// seconds; when the agent exits, at once; and when the reaper itself was
// killed with the node, ReapLife finds it by its agent's token, while a
// process without the token is left alone.
func TestReaperContainsTheWholeTree(t *testing.T) {
	t.Run("the node is killed", func(t *testing.T) {
		t.Parallel()
		n := startTestNode(t, "reaper", "forker")
		if !alive(n.child) {
			t.Fatalf("the agent's tool %d is not running", n.child)
		}
		n.kill()
		waitGone(t, "the tool in its own session", func() bool { return !alive(n.child) })
		waitGone(t, "the agent", func() bool { return !alive(n.agent) })
		waitGone(t, "the reaper", func() bool { return !alive(n.reaper) })
	})
	t.Run("the agent exits", func(t *testing.T) {
		t.Parallel()
		exe, _ := os.Executable()
		r, err := proc.StartReaper(exe)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{exe, "forker-exit"}, Reaper: r})
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 64)
		n, _ := out.Read(b)
		child := atoi(t, strings.TrimSpace(string(b[:n])))
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the agent's exit was never reported")
		}
		if d := proc.ExitDescription(p.Err()); d != "exit status 0" {
			t.Errorf("the agent ended %s", d)
		}
		if alive(child) {
			t.Errorf("the tool %d the agent started outlived it", child)
		}
	})
	t.Run("the reaper is killed too", func(t *testing.T) {
		t.Parallel()
		bystander := startSleeper(t)
		n := startTestNode(t, "reaper", "forker")
		syscall.Kill(n.reaper, syscall.SIGKILL)
		n.kill()
		// The agent dies with its reaper (a parent-death signal); the tool
		// in its own session is an orphan of init now.
		waitGone(t, "the agent", func() bool { return !alive(n.agent) })
		if !alive(n.child) {
			t.Fatal("the tool died with nothing to kill it: the test shows nothing")
		}
		if killed := proc.ReapLife("test-life"); killed == 0 {
			t.Error("ReapLife killed nothing")
		}
		waitGone(t, "the orphaned tool", func() bool { return !alive(n.child) })
		if !alive(bystander) {
			t.Error("ReapLife killed a process that was not the agent's")
		}
	})
}

func startSleeper(t *testing.T) int {
	t.Helper()
	exe, _ := os.Executable()
	p, err := os.StartProcess(exe, []string{exe, "sleeper"}, &os.ProcAttr{Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	return p.Pid
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a pid: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}
