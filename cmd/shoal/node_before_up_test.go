package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
)

// A node started on a NATS deployment before the coordinator has made
// the fabric's stream and buckets there (a service manager or compose
// starting them together, the coordinator's first start slow) waits,
// saying for what, and joins once the coordinator is up: it exited
// before ("open KV bucket shoal_agents: bucket not found").
func TestNodeStartedBeforeTheCoordinatorWaitsForIt(t *testing.T) {
	t.Parallel()
	n := newTestNATS(t)
	n.start()
	fake := fakemodel.Start(t, fakemodel.Config{})
	p := n.startNode(fake, "early")
	poll.Until(t, 30*time.Second, "the node to say it waits for the coordinator", func() bool {
		return strings.Contains(p.stderrText(), "waiting for the coordinator")
	})
	select {
	case <-p.done:
		t.Fatalf("the node started before the coordinator exited %d:\n%s", p.cmd.ProcessState.ExitCode(), p.stderrText())
	default:
	}
	// One stopped while it waits exits as a stopped command does.
	stopped := n.startNode(fake, "stopped")
	poll.Until(t, 30*time.Second, "the second node to say it waits for the coordinator", func() bool {
		return strings.Contains(stopped.stderrText(), "waiting for the coordinator")
	})
	if code := stopped.stop(syscall.SIGINT); code != exitInterrupted {
		t.Errorf("a node stopped while it waited for the coordinator exited %d, want %d:\n%s", code, exitInterrupted, stopped.stderrText())
	}
	up := n.up()
	p.waitLine("shoal: node early joined")
	nodes, _ := n.buckets()
	waitHeartbeat(t, nodes, "early", time.Time{})
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("the node stopped with SIGTERM exited %d:\n%s", code, p.stderrText())
	}
	up.stop(syscall.SIGTERM)
}
