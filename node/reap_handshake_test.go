package node_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// An ACP agent starts what it serves from (an MCP server, a language
// server) as it starts, and takes a while to answer initialize. The node
// and its reaper are killed during that handshake, as in
// TestKilledNodeAndReaperAreReaped: the CLI dies with the reaper, and
// what it started, carrying the agent's life token, is left to init. The
// restarted node reaps it, as it does for an agent that had started: the
// token was written down only once the start was over.
func TestKilledDuringAnACPHandshakeIsReaped(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	pidfile := filepath.Join(t.TempDir(), "server.pid")
	script := filepath.Join(t.TempDir(), "slow-acp.sh")
	// It starts its server (in its process group, as a child would be),
	// then reads its stdin and never answers initialize.
	os.WriteFile(script, []byte("#!/bin/sh\nsleep 300 &\necho $! > "+pidfile+"\nexec cat >/dev/null\n"), 0o700)
	cmd, exited, _ := startNodeProcess(t, b.ClientURL(), dir, "", "SHOAL_TEST_ACP_SCRIPT="+script)
	fabric, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	poll.Until(t, 30*time.Second, "the node process is up", func() bool {
		nodes, _ := fabric.Nodes(ctx)
		return len(nodes) == 1
	})
	go fabric.Open(ctx, schemas.OpenRequest{Model: "acp:gemini", CWD: t.TempDir()})
	var server int
	poll.Until(t, 30*time.Second, "the agent started its server and waits in its handshake", func() bool {
		b, err := os.ReadFile(pidfile)
		server, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && server > 0
	})
	time.Sleep(500 * time.Millisecond)
	reaper := childWithArg(t, cmd.Process.Pid, proc.ReaperArg)
	syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP)
	syscall.Kill(reaper, syscall.SIGKILL)
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	time.Sleep(time.Second)
	if !alive(server) {
		t.Fatal("the agent's server died with the node; this test needs it left behind to prove the reaping")
	}
	defer syscall.Kill(server, syscall.SIGKILL)
	startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, broker: b})
	time.Sleep(3 * time.Second)
	if alive(server) {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", server))
		var life string
		for kv := range strings.SplitSeq(string(env), "\x00") {
			if strings.HasPrefix(kv, proc.LifeEnv+"=") {
				life = kv
			}
		}
		t.Fatalf("the restarted node left the agent's server (pid %d, %s) running: pids.json never had its life token", server, life)
	}
}
