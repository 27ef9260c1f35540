//go:build unix

package backend_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
)

// The test binary plays the parts by its first argument: the keeper, an
// agent (sleeper, exit3, echo), and a node that starts a sleeper through
// the keeper and then waits to be killed.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "keeper":
			os.Exit(backend.RunKeeper(os.Args[2:]))
		case "sleeper":
			time.Sleep(5 * time.Minute)
			os.Exit(0)
		case "exit3":
			fmt.Fprintln(os.Stderr, "fatal: the agent gave up")
			os.Exit(3)
		case "echo":
			io.Copy(os.Stdout, os.Stdin)
			os.Exit(0)
		case "node":
			exe, _ := os.Executable()
			backend.Keeper = []string{exe, "keeper"}
			p, _, err := backend.StartProcess(backend.ProcessSpec{Argv: []string{exe, "sleeper"}})
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(p.PID())
			select {}
		}
	}
	os.Exit(m.Run())
}

func withKeeper(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	backend.Keeper = []string{exe, "keeper"}
	t.Cleanup(func() { backend.Keeper = nil })
	return exe
}

func wait(t *testing.T, p *backend.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the process never ended")
	}
}

// Through the keeper an agent's stdin and stdout pass as they are, and
// the agent's exit, by code or by signal, is the keeper's.
func TestKeeperIsTransparent(t *testing.T) {
	exe := withKeeper(t)

	p, out, err := backend.StartProcess(backend.ProcessSpec{Argv: []string{exe, "echo"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteLine(t.Context(), []byte("hello through the keeper")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "hello through the keeper\n" {
		t.Fatalf("read %q %v", line, err)
	}
	p.Stop(t.Context(), []backend.Step{{Signal: backend.CloseStdin, Wait: 5 * time.Second}})
	if d := backend.ExitDescription(p.Err()); d != "exit status 0" {
		t.Fatalf("echo ended %s", d)
	}

	p, _, err = backend.StartProcess(backend.ProcessSpec{Argv: []string{exe, "exit3"}})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, p)
	if d := backend.ExitDescription(p.Err()); d != "exit status 3" || !strings.Contains(p.StderrTail(), "the agent gave up") {
		t.Fatalf("exit3 ended %s, stderr %q", d, p.StderrTail())
	}

	p, _, err = backend.StartProcess(backend.ProcessSpec{Argv: []string{exe, "sleeper"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p.Stop(ctx, []backend.Step{{Signal: syscall.SIGTERM, Wait: 10 * time.Second}})
	if d := backend.ExitDescription(p.Err()); d != "killed by signal: terminated" {
		t.Fatalf("the sleeper ended %s", d)
	}

	if _, _, err := backend.StartProcess(backend.ProcessSpec{Argv: []string{"/nonexistent/agent"}}); err == nil || !strings.Contains(err.Error(), "could not launch") {
		t.Fatalf("a missing agent: %v", err)
	}
}

// A node killed with SIGKILL takes its agents with it: the lifeline ends
// and the keeper ends the agent's process group.
func TestKeeperEndsTheAgentWhenTheNodeDies(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	node := exec.Command(exe, "node")
	out, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	defer node.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the node said %q: %v", line, err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the node said %q", line)
	}
	if err := syscall.Kill(-pgid, 0); err != nil {
		t.Fatalf("the agent's group %d is not running: %v", pgid, err)
	}
	node.Process.Signal(syscall.SIGKILL)
	node.Wait()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(-pgid, 0); err == syscall.ESRCH {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's group %d outlived its node", pgid)
		}
	}
}
