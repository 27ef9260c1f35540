package main

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
)

// A node stopped (Ctrl-C, a service manager's SIGTERM) while it waits for
// a fabric that is not up exits as a stopped command does (130), not as
// a failure to reach NATS (4).
func TestNodeStoppedWhileWaitingForTheFabric(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close() // nobody listens there
	home := filepath.Join(t.TempDir(), "n1")
	n := startShoal(t, home, nil, "node", "--nats", "nats://127.0.0.1:"+port, "--node-name", "waiting")
	poll.Until(t, 30*time.Second, "the node to say it waits for the fabric", func() bool {
		return strings.Contains(n.stderrText(), "waiting for the fabric")
	})
	if code := n.stop(syscall.SIGINT); code != exitInterrupted {
		t.Errorf("a node stopped while it waited for the fabric exited %d, want %d; stderr:\n%s", code, exitInterrupted, n.stderrText())
	}
}
