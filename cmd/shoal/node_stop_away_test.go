package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
)

// A node stopped while its fabric is away says why its stop may take a
// while, and what becomes of what it holds: it waited its whole shutdown
// in silence (a new user's walkthrough).
func TestNodeStoppedWhileTheFabricIsAwaySaysSo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	up := startShoal(t, dir, nil, "up", "--port", port, "--no-node", "--no-bus", "--no-mcp", "--node-ttl", "3s")
	up.waitLine("shoal: ready")
	home := filepath.Join(dir, "node")
	node := startShoal(t, home, nil, "node", "--nats", "nats://127.0.0.1:"+port, "--name", "n1", "--stop-wait", "500ms")
	node.waitLine("shoal: node n1 joined")
	up.stop(syscall.SIGKILL)
	poll.Until(t, 30*time.Second, "the node to find its fabric away", func() bool {
		return strings.Contains(node.stderrText(), "heartbeat failed")
	})
	if code := node.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("the node exited %d", code)
	}
	if !strings.Contains(node.stderrText(), "stopping while the fabric is away") {
		t.Errorf("the node stopped while its fabric was away without saying so:\n%s", node.stderrText())
	}
}

// A second Ctrl-C (or SIGTERM) stops a process that is stopping at once,
// as a user expects: a node waiting for a fabric that is away is not
// kept 30 s, and it says what it leaves to its next start.
func TestASecondSignalStopsAtOnce(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	node := p.node("n1")
	p.openOn() // its closing events wait for the fabric
	p.up.stop(syscall.SIGKILL)
	poll.Until(t, 30*time.Second, "the node to find its fabric away", func() bool {
		return strings.Contains(node.stderrText(), "heartbeat failed")
	})
	node.cmd.Process.Signal(syscall.SIGINT)
	poll.Until(t, 30*time.Second, "the node to say it waits for its fabric", func() bool {
		return strings.Contains(node.stderrText(), "stopping while the fabric is away")
	})
	if code := node.stop(syscall.SIGINT); code != 130 {
		t.Errorf("a node stopping, signalled again: exit %d, want 130\n%s", code, node.stderrText())
	}
	if !strings.Contains(node.stderrText(), "shoal: interrupt again: stopping at once") {
		t.Errorf("the node stopped at once without saying so:\n%s", node.stderrText())
	}
}
