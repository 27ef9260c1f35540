package node_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// A node killed with SIGKILL takes everything its agent started with it,
// a tool in a session of its own included (the claude CLI starts its Bash
// tools so): its reaper sees the lifeline end and kills its whole tree,
// within seconds, with no restart needed.
func TestKilledNodeLeavesNothing(t *testing.T) {
	t.Parallel()
	k := startKilledNode(t)
	k.killNode()
	poll.Until(t, 5*time.Second, "the agent CLI dies with its node", func() bool { return !alive(k.agent) })
	poll.Until(t, 5*time.Second, "the tool in its own session dies with the node", func() bool { return !alive(k.tool) })
	poll.Until(t, 5*time.Second, "the reaper is gone", func() bool { return !alive(k.reaper) })
}

// A node killed with SIGKILL together with its reaper: the agent CLI dies
// with the reaper (a parent-death signal), and the tool in its own session,
// an orphan of init, is reaped by the restarted node, found by the token
// every process of the agent's life carries. The lost agent is not
// resurrected.
func TestKilledNodeAndReaperAreReaped(t *testing.T) {
	t.Parallel()
	k := startKilledNode(t)
	// The node frozen first, so it cannot end what the dying reaper
	// leaves behind: both go as if at once.
	if err := syscall.Kill(k.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(k.reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	k.killNode()
	poll.Until(t, 10*time.Second, "the agent CLI dies with its reaper", func() bool { return !alive(k.agent) })
	if !alive(k.tool) {
		t.Fatal("the agent's tool died with the node and its reaper; this test needs it left behind to prove the reaping")
	}
	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: k.dir, broker: k.b})
	poll.Until(t, 10*time.Second, "the restarted node reaps the tool", func() bool { return !alive(k.tool) })
	ctx := t.Context()
	rec, err := g.fabric.Record(ctx, k.id)
	if err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("the lost agent's record: %+v %v", rec, err)
	}
	if _, err := g.fabric.Send(ctx, schemas.SendRequest{AgentID: k.id, Text: "hello?"}); err == nil || err.Error() != "agent '"+k.id+"' is dead" {
		t.Errorf("a send to the lost agent: %v", err)
	}
	b2, _ := os.ReadFile(filepath.Join(k.dir, "pids.json"))
	if strings.TrimSpace(string(b2)) != "{}" {
		t.Errorf("pids.json after reaping: %s", b2)
	}
}

// The reaper killed with SIGKILL while its node lives: the agent CLI dies
// with it, and the node, seeing its agent die so, ends the tool the CLI
// left in a session of its own, rather than forgetting it.
func TestKilledReaperLeavesNothing(t *testing.T) {
	t.Parallel()
	k := startKilledNode(t)
	if err := syscall.Kill(k.reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the agent CLI dies with its reaper", func() bool { return !alive(k.agent) })
	poll.Until(t, 10*time.Second, "the node ends the tool its agent left", func() bool { return !alive(k.tool) })
	b, _ := os.ReadFile(filepath.Join(k.dir, "pids.json"))
	if strings.TrimSpace(string(b)) != "{}" {
		t.Errorf("pids.json after the agent died: %s", b)
	}
}

// killedNode is a node process whose agent started a tool in a session of
// its own.
type killedNode struct {
	b                   *broker.Broker
	dir, id             string
	cmd                 *exec.Cmd
	exited              <-chan struct{}
	agent, tool, reaper int
}

func startKilledNode(t *testing.T) *killedNode {
	t.Helper()
	k := &killedNode{b: natstest.Start(t), dir: t.TempDir()}
	pidfile := filepath.Join(t.TempDir(), "tool.pid")
	var stderr *strings.Builder
	k.cmd, k.exited, stderr = startNodeProcess(t, k.b.ClientURL(), k.dir, "orphan", "SHOAL_FAKE_PIDFILE="+pidfile)
	fabric, err := client.NewDirect(natstest.Connect(t, k.b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := fabric.Nodes(ctx)
		return len(nodes) == 1
	})
	rep, err := fabric.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v; node stderr:\n%s", err, stderr.String())
	}
	k.id = rep.AgentID
	poll.Until(t, 30*time.Second, "the agent started its tool", func() bool {
		b, err := os.ReadFile(pidfile)
		k.tool, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && k.tool > 0
	})
	k.agent = pidOf(t, &fixture{t: t, dir: k.dir}, k.id)
	k.reaper = childWithArg(t, k.cmd.Process.Pid, proc.ReaperArg)
	for _, pid := range []int{k.agent, k.tool, k.reaper} {
		if !alive(pid) {
			t.Fatalf("process %d is not running before the kill", pid)
		}
	}
	return k
}

func (k *killedNode) killNode() {
	k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.exited
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
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
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

// startNodeProcess runs a node in a child process (this test binary,
// re-executed) whose fake claude CLI behaves as mode, and returns it with
// a channel closed when it exits.
func startNodeProcess(t *testing.T, natsURL, dir, mode string, env ...string) (*exec.Cmd, <-chan struct{}, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), "SHOAL_TEST_NODE=1", "SHOAL_TEST_NATS="+natsURL,
		"SHOAL_TEST_DIR="+dir, "SHOAL_TEST_MODE="+mode), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	return cmd, exited, &stderr
}

// A node killed with SIGKILL mid-turn and restarted at once, before its
// heartbeat entry expires, so no coordinator ever sees it lost (none runs
// here at all): the restarted node closes the turn its previous run left
// open, on the stream, in order after the last stored event, and the id
// can be opened again with its events numbered after those.
func TestRestartedNodeClosesWhatItLeftOpen(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	cmd, exited, stderr := startNodeProcess(t, b.ClientURL(), dir, "chatty")

	conn := natstest.Connect(t, b)
	fabric, err := client.NewDirect(conn, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := fabric.Nodes(ctx)
		return len(nodes) == 1
	})
	rep, err := fabric.Open(ctx, schemas.OpenRequest{ID: "left-open", CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v; node stderr:\n%s", err, stderr.String())
	}
	w := (&fixture{t: t, js: fabric.JetStream()}).watch(rep.AgentID)
	if _, err := fabric.Send(ctx, schemas.SendRequest{AgentID: rep.AgentID, Text: "talk until stopped"}); err != nil {
		t.Fatal(err)
	}
	w.until(w.until(0, "the turn starting", isKind(schemas.KindTurnStarted)), "streamed text", isKind(schemas.KindAssistantText))
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	before := len(w.events())

	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, broker: b})
	end := w.until(before, "the agent's death", isStatus(schemas.StatusDead))
	evs := w.events()
	if end < 2 {
		t.Fatalf("the stream ends too soon: %s", strings.Join(w.summary(0), " "))
	}
	closing := evs[end-2 : end+1]
	e, ok := closing[0].Payload.(schemas.Error)
	if !ok || e.Message != "node n1 restarted during turn 1; the turn cannot finish" || closing[0].Turn != 1 {
		t.Errorf("the first closing event: %s", closing[0].raw)
	}
	if r, ok := closing[1].Payload.(schemas.Result); !ok || r.StopReason != schemas.StopCancelled || closing[1].Turn != 1 {
		t.Errorf("the turn's result: %s", closing[1].raw)
	}
	for _, ev := range evs[:end-2] {
		if ev.Kind() == schemas.KindResult {
			t.Errorf("the killed turn had a result before the restart: %s", ev.raw)
		}
	}
	if got := g.host; got == nil {
		t.Fatal("no restarted node")
	}
	rec, err := g.fabric.Record(ctx, rep.AgentID)
	if err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("the left-open agent's record: %+v %v", rec, err)
	}

	// The id opens again; its new life's events follow the closing ones.
	if _, err := g.fabric.Open(ctx, schemas.OpenRequest{ID: rep.AgentID, CWD: t.TempDir()}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if _, err := g.fabric.Send(ctx, schemas.SendRequest{AgentID: rep.AgentID, Text: "hello again"}); err != nil {
		t.Fatal(err)
	}
	w.until(end+1, "the new life's result", isResult(2))
	if got := w.events()[end+1].seq; got != evs[end].seq+1 {
		t.Errorf("the new life's first event is number %d, after %d", got, evs[end].seq)
	}
}

// A node killed with SIGKILL together with its reaper, and the dead CLI's
// pid number handed, on purpose, to an unrelated process that makes a
// process group of its own and leaves a child in it: the restarted node
// reaps the agent's tool (it carries the agent's life token) and leaves
// the stranger's group alone, since nothing proves it is the agent's.
func TestRecycledPidIsLeftAlone(t *testing.T) {
	t.Parallel()
	k := startKilledNode(t)
	if err := syscall.Kill(k.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(k.reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	k.killNode()
	poll.Until(t, 10*time.Second, "the agent CLI dies with its reaper", func() bool { return !alive(k.agent) })
	stranger := recyclePid(t, k.agent)
	if !alive(k.tool) {
		t.Fatal("the agent's tool died with the node and its reaper; this test needs it left behind to prove the reaping ran")
	}
	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: k.dir, broker: k.b})
	poll.Until(t, 10*time.Second, "the restarted node reaps the tool", func() bool { return !alive(k.tool) })
	_ = g
	if !alive(stranger) {
		t.Fatalf("the restart's reap killed process %d, an unrelated process in the group numbered as the dead CLI's pid %d", stranger, k.agent)
	}
}

// recyclePid makes pid's number the pid of a new process that puts itself
// in a process group of its own, starts a child (a sleep) in that group,
// and exits, and returns the child's pid: the group then has the dead
// process's number and no leader. It sets the kernel's last handed-out pid
// just below the number, so it needs root; other processes forking at
// the same moment can take the number first, so it tries again.
func recyclePid(t *testing.T, pid int) int {
	t.Helper()
	const lastPid = "/proc/sys/kernel/ns_last_pid"
	// The number is free once nothing has it as its pid or its group.
	poll.Until(t, 20*time.Second, "the dead CLI's process group is gone", func() bool {
		return syscall.Kill(-pid, 0) == syscall.ESRCH && syscall.Kill(pid, 0) == syscall.ESRCH
	})
	deadline := time.Now().Add(20 * time.Second)
	for try := 0; time.Now().Before(deadline); try++ {
		if try > 0 && try%50 == 0 {
			time.Sleep(50 * time.Millisecond)
		}
		if err := os.WriteFile(lastPid, []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatalf("this test hands a dead process's pid to another on purpose, by writing %s, which needs root: %v", lastPid, err)
		}
		cmd := exec.Command("/bin/sh", "-c", "sleep 300 & echo $!")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got := cmd.Process.Pid
		b := make([]byte, 32)
		n, _ := out.Read(b)
		cmd.Wait()
		child, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
		if child > 0 {
			t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
		}
		if got != pid {
			if child > 0 {
				syscall.Kill(child, syscall.SIGKILL)
			}
			continue
		}
		if child <= 0 || !alive(child) {
			t.Fatalf("the process given pid %d left no child", pid)
		}
		if pgid, _ := syscall.Getpgid(child); pgid != pid {
			t.Fatalf("the stranger's child is in group %d, want %d", pgid, pid)
		}
		return child
	}
	t.Fatalf("pid %d was taken by other processes on every try for 20s", pid)
	return 0
}

// The reaper killed with SIGKILL while its node lives: the node starts
// another within a heartbeat, and no open fails on it meanwhile for want
// of one (the old node kept advertising itself, and every open on it
// failed with a broken pipe and left a dead record). An open either
// waits for the new reaper or is refused, saying why, leaving nothing.
func TestKilledReaperIsReplaced(t *testing.T) {
	t.Parallel()
	k := startKilledNode(t)
	fabric, err := client.NewDirect(natstest.Connect(t, k.b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := syscall.Kill(k.reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	opened := ""
	for i := 0; opened == ""; i++ {
		if i > 200 {
			t.Fatal("no open succeeded on the node after its reaper was killed")
		}
		id := "after-" + strconv.Itoa(i)
		rep, err := fabric.Open(ctx, schemas.OpenRequest{ID: id, CWD: t.TempDir()})
		if err == nil {
			opened = rep.AgentID
			break
		}
		if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "cannot start agents now") {
			t.Fatalf("open %d after the reaper was killed: %v (%s)", i, err, schemas.CodeOf(err))
		}
		if rec, err := fabric.Record(ctx, id); schemas.CodeOf(err) != schemas.CodeNotFound {
			t.Fatalf("a refused open left a record: %+v %v", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var next int
	poll.Until(t, 5*time.Second, "a new reaper runs", func() bool {
		next = childWithArg(t, k.cmd.Process.Pid, proc.ReaperArg)
		return next != k.reaper && alive(next)
	})
	agent := pidOf(t, &fixture{t: t, dir: k.dir}, opened)
	if !alive(agent) {
		t.Fatalf("the agent opened after the reaper was replaced is not running")
	}
	nodes, err := fabric.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Unhealthy != "" {
		t.Fatalf("the node's record after its reaper was replaced: %+v %v", nodes, err)
	}
}
