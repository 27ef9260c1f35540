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

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node killed with SIGKILL while its agent runs: the agent CLI dies with
// it (parent-death signal), and what the CLI started is reaped by the
// restarted node from pids.json. The lost agent is not resurrected.
func TestKilledNodeIsReaped(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	pidfile := filepath.Join(t.TempDir(), "grandchild.pid")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SHOAL_TEST_NODE=1", "SHOAL_TEST_NATS="+b.ClientURL(),
		"SHOAL_TEST_DIR="+dir, "SHOAL_TEST_MODE=orphan", "SHOAL_FAKE_PIDFILE="+pidfile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })

	client := natstest.Connect(t, b)
	fabric, err := bridge.NewFabric(client, bridge.FabricConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	eventually(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := fabric.Nodes(ctx)
		return len(nodes) == 1
	})
	rep, err := fabric.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatalf("open: %v; node stderr:\n%s", err, stderr.String())
	}
	var grandchild int
	eventually(t, 30*time.Second, "the agent started its child", func() bool {
		b, err := os.ReadFile(pidfile)
		grandchild, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && grandchild > 0
	})
	f := &fixture{t: t, dir: dir}
	agentPID := pidOf(t, f, rep.AgentID)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	eventually(t, 10*time.Second, "the agent CLI dies with its node", func() bool { return !alive(agentPID) })
	if !alive(grandchild) {
		t.Fatal("the agent's child died with the node; this test needs it left behind to prove the reaping")
	}

	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, broker: b})
	eventually(t, 10*time.Second, "the restarted node reaps the child", func() bool { return !alive(grandchild) })
	rec, _, err := g.fabric.Record(ctx, rep.AgentID)
	if err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("the lost agent's record: %+v %v", rec, err)
	}
	if _, err := g.fabric.Send(ctx, schemas.SendRequest{AgentID: rep.AgentID, Text: "hello?"}); err == nil || err.Error() != "agent '"+rep.AgentID+"' is dead" {
		t.Errorf("a send to the lost agent: %v", err)
	}
	b2, _ := os.ReadFile(filepath.Join(dir, "pids.json"))
	if strings.TrimSpace(string(b2)) != "{}" {
		t.Errorf("pids.json after reaping: %s", b2)
	}
}
