//go:build unix

package proc_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/proc"
	"go.uber.org/goleak"
)

// The test binary plays the parts by its first argument: the keeper, an
// agent (sleeper, exit3, echo), and a node that starts a sleeper through
// the keeper and then waits to be killed.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case proc.KeeperArg:
			os.Exit(proc.RunKeeper(os.Args[2:]))
		case proc.ReaperArg:
			os.Exit(proc.RunReaper())
		case proc.SandboxArg:
			os.Exit(proc.RunSandbox(os.Args[2:]))
		case proc.SandboxInitArg:
			os.Exit(proc.RunSandboxInit(os.Args[2:]))
		case "sleeper":
			time.Sleep(5 * time.Minute)
			os.Exit(0)
		case "exit3":
			fmt.Fprintln(os.Stderr, "fatal: the agent gave up")
			os.Exit(3)
		case "echo":
			io.Copy(os.Stdout, os.Stdin)
			os.Exit(0)
		case "forker", "forker-exit":
			// Starts a sleeper in a session of its own, as the claude CLI
			// starts a Bash tool, and says its pid.
			exe, _ := os.Executable()
			c := exec.Command(exe, "sleeper")
			c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := c.Start(); err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(c.Process.Pid)
			if os.Args[1] == "forker-exit" {
				os.Exit(0)
			}
			time.Sleep(5 * time.Minute)
			os.Exit(0)
		case "node":
			// A node that starts an agent through a reaper or a keeper
			// (node reaper|keeper [agent]; a sleeper by default), says the
			// agent's pid and the reaper's, and, for an agent other than a
			// sleeper, the agent's own first line, then waits to be killed.
			exe, _ := os.Executable()
			spec := proc.ProcessSpec{Argv: []string{exe, "sleeper"}, Env: append(os.Environ(), proc.LifeEnv+"=test-life")}
			if len(os.Args) > 3 {
				spec.Argv[1] = os.Args[3]
			}
			reaperPID := 0
			if os.Args[2] == "keeper" {
				spec.Keeper = []string{exe, proc.KeeperArg}
			} else {
				r, err := proc.StartReaper(exe)
				if err != nil {
					fmt.Println("error", err)
					os.Exit(1)
				}
				spec.Reaper, reaperPID = r, r.PID()
			}
			p, out, err := proc.StartProcess(spec)
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(p.PID(), reaperPID)
			if spec.Argv[1] != "sleeper" {
				line, _ := bufio.NewReader(out).ReadString('\n')
				fmt.Print(line)
			}
			select {}
		}
	}
	goleak.VerifyTestMain(m)
}

func withKeeper(t *testing.T) (string, []string) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe, []string{exe, proc.KeeperArg}
}

func wait(t *testing.T, p *proc.Process) {
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
	exe, keeper := withKeeper(t)

	p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{exe, "echo"}, Keeper: keeper})
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
	p.Stop(t.Context(), []proc.Step{{Signal: proc.CloseStdin, Wait: 5 * time.Second}})
	if d := proc.ExitDescription(p.Err()); d != "exit status 0" {
		t.Fatalf("echo ended %s", d)
	}

	p, _, err = proc.StartProcess(proc.ProcessSpec{Argv: []string{exe, "exit3"}, Keeper: keeper})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, p)
	if d := proc.ExitDescription(p.Err()); d != "exit status 3" || !strings.Contains(p.StderrTail(), "the agent gave up") {
		t.Fatalf("exit3 ended %s, stderr %q", d, p.StderrTail())
	}

	p, _, err = proc.StartProcess(proc.ProcessSpec{Argv: []string{exe, "sleeper"}, Keeper: keeper})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p.Stop(ctx, []proc.Step{{Signal: syscall.SIGTERM, Wait: 10 * time.Second}})
	if d := proc.ExitDescription(p.Err()); d != "killed by signal: terminated" {
		t.Fatalf("the sleeper ended %s", d)
	}

	if _, _, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{"/nonexistent/agent"}, Keeper: keeper}); err == nil || !strings.Contains(err.Error(), "could not launch") {
		t.Fatalf("a missing agent: %v", err)
	}
}

// A node killed with SIGKILL takes its agents with it: the lifeline ends
// and the keeper ends the agent's process group.
func TestKeeperEndsTheAgentWhenTheNodeDies(t *testing.T) {
	n := startTestNode(t, "keeper", "sleeper")
	if err := syscall.Kill(-n.agent, 0); err != nil {
		t.Fatalf("the agent's group %d is not running: %v", n.agent, err)
	}
	n.kill()
	waitGone(t, "the agent's group", func() bool { return syscall.Kill(-n.agent, 0) == syscall.ESRCH })
}

// testNode is a node process of this test binary holding one agent.
type testNode struct {
	cmd                  *exec.Cmd
	agent, reaper, child int // child: the pid the agent printed, if any
}

func startTestNode(t *testing.T, holder, agent string) *testNode {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "node", holder, agent)
	var stderr bytes.Buffer // read once the process has ended
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &testNode{cmd: cmd}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// A node that never says its pids is killed, so the read ends and the
	// test fails saying so, rather than waiting for the test binary's
	// timeout.
	stuck := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	defer stuck.Stop()
	said := func(what string, line string, err error, perr error) {
		t.Helper()
		if err != nil || perr != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the %s said %q: %v %v (within a minute: the node is killed after it); its stderr:\n%s", what, line, err, perr, stderr.String())
		}
	}
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	_, perr := fmt.Sscan(line, &n.agent, &n.reaper)
	said("node", line, err, perr)
	if agent != "sleeper" {
		line, err := r.ReadString('\n')
		_, perr := fmt.Sscan(line, &n.child)
		said("agent", line, err, perr)
	}
	return n
}

func (n *testNode) kill() {
	n.cmd.Process.Signal(syscall.SIGKILL)
	n.cmd.Wait()
}

func waitGone(t *testing.T, what string, gone func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !gone(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there 5s later", what)
		}
	}
}
