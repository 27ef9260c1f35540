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
