package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Credentials that expire while a node or a client runs: the server ends
// the connection ("User Authentication Expired") and takes them no more.
// An outside review found the node saying only "lost the fabric;
// connecting again … err=EOF", then failing its heartbeat every 5 s for
// good, never naming the expiry nor exiting; and `shoal tail` ending
// with "the coordinator stopped streaming the replay" (exit 4). Each now
// ends, exit 2, naming the credentials file, that they expired, and the
// command that issues new ones; the node stops its agents as on any
// stop.
func TestExpiredCredentialsEndTheNodeAndTheClientSayingSo(t *testing.T) {
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	issue := func(role, name string, expires time.Duration) string {
		t.Helper()
		path := filepath.Join(dir, name+".creds")
		if code, _, errOut := runShoal(t, dir, nil, "creds", role, name, "--out", path, "--auth-dir", authDir, "--expires", expires.String()); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", role, name, errOut)
		}
		return path
	}
	up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", "-1",
		"--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", "2s")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")

	nodeCreds, clientCreds := issue("node", "exp", 8*time.Second), issue("client", "me", 8*time.Second)
	node := startShoal(t, filepath.Join(dir, "exp"), nil, "node", "--nats", url, "--creds", nodeCreds, "--claude", "/bin/false", "--stop-wait", "500ms")
	node.waitLine("shoal: node exp joined")
	tail := startShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + clientCreds}, "tail", "--from", "new")
	tui := startTUI(t, append(baseEnv(t.TempDir()), "SHOAL_NATS="+url, "SHOAL_CREDS="+clientCreds))
	tui.waitText("no agents yet")

	for _, c := range []struct {
		p       *shoalProc
		name    string
		reissue string
	}{{node, "the node", "shoal creds node exp"}, {tail, "shoal tail", "shoal creds client me"}} {
		select {
		case <-c.p.done:
		case <-time.After(90 * time.Second):
			t.Fatalf("%s still runs more than a minute after its credentials expired; it said:\n%s", c.name, c.p.stderrText())
		}
		said := c.p.stderrText()
		if code := c.p.cmd.ProcessState.ExitCode(); code != exitUsage {
			t.Errorf("%s exited %d after its credentials expired, not %d", c.name, code, exitUsage)
		}
		creds := nodeCreds
		if c.p == tail {
			creds = clientCreds
		}
		for _, want := range []string{creds, "expired", c.reissue} {
			if !strings.Contains(said, want) {
				t.Errorf("%s, its credentials expired, does not say %q; it said:\n%s", c.name, want, said)
			}
		}
	}
	// The monitor ends too (it watched a connection that never came back),
	// and says why.
	tui.waitText("shoal tui: the credentials in")
	tui.waitText("expired")
}
