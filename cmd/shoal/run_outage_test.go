package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A run by a caller with client credentials, whose requests go through
// the coordinator's fabric service, outlives a SIGKILL of the coordinator
// mid-turn: the request the dead coordinator had taken was never answered
// and never sent again, and the run waited out its --wait and a minute
// more, then said the coordinator did not answer, for a turn that had
// ended seconds after the coordinator came back. The client sends it
// again under the same request id once its connection is back, and the
// node answers the copy with the turn it ran, not with a second turn.
func TestRunThroughTheFabricOutlivesACoordinatorKilledMidTurn(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t))
	// A TTL of the node's heartbeat longer than the outage: the node is
	// not lost meanwhile.
	p := startAuthPool(t, "client", "me", "--port", port, "--node-ttl", "20s")
	// A turn of about eight seconds.
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("steady ", 80), ChunkSize: 7, Delay: 100 * time.Millisecond})
	var open schemas.OpenReply
	if err := json.Unmarshal([]byte(p.must(t, "open", "--json", t.TempDir())), &open); err != nil {
		t.Fatal(err)
	}
	id := open.AgentID
	run := startShoal(t, t.TempDir(), p.as, "run", "--wait", "20s", id, "Go on.")
	poll.Until(t, time.Minute, "the turn runs", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := runShoal(t, t.TempDir(), p.as, "status", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusWorking
	})
	if _, err := p.fake.WaitRequests(t.Context(), 1); err != nil {
		t.Fatalf("the model was not asked for the turn: %v", err)
	}
	p.up.stop(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // the run's connection and the node's find it gone
	p.up = startShoal(t, p.dir, nil, p.upArgs...)
	p.up.waitLine("shoal: ready")
	select {
	case <-run.done:
	case <-time.After(70 * time.Second):
		t.Fatalf("shoal run still waits after the coordinator came back, its turn long ended; it said:\n%s", run.stderrText())
	}
	if code := run.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("shoal run: exit %d:\n%s", code, run.stderrText())
	}
	if out := strings.Join(run.stdoutLines(), "\n"); !strings.Contains(out, "steady steady") {
		t.Errorf("shoal run printed %q, not the turn's answer", out)
	}
	// The copy sent again did not queue a second turn: the agent ran one.
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(p.must(t, "status", id)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Turn != 1 || rec.Held != 0 {
		t.Errorf("the agent numbered %d turns (%d held); one was asked for", rec.Turn, rec.Held)
	}
}

// The same, with a coordinator on a NATS deployment of its own (shoal up
// --nats): the caller's connection never goes, so nothing told the client
// that the coordinator which took its run was gone, and the run waited out
// its --wait and a minute more. The coordinator now says, every few
// seconds, that it still holds the request; once it has said nothing for
// a while the client sends the request again, under the same request id,
// and the coordinator started again takes it up.
func TestRunOutlivesACoordinatorKilledWhileItsServerStaysUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ns := startShoalNATS(t, dir, [2]string{"coordinator", "hq"}, [2]string{"client", "cli"}, [2]string{"node", "far"})
	upArgs := []string{"up", "--nats", ns.ClientURL(), "--creds", filepath.Join(dir, "hq.creds"), "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", "30s"}
	up := startShoal(t, filepath.Join(dir, "up"), nil, upArgs...)
	up.waitLine("shoal: ready")
	fake := fakemodel.Start(t, fakemodel.Config{})
	home := filepath.Join(dir, "far")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	node := startShoal(t, home, env, "node", "--nats", ns.ClientURL(), "--creds", filepath.Join(dir, "far.creds"), "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms")
	node.waitLine("shoal: node far joined")
	as := []string{"SHOAL_NATS=" + ns.ClientURL(), "SHOAL_CREDS=" + filepath.Join(dir, "cli.creds")}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), as, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s%s", args, code, out, errOut)
		}
		return strings.TrimSpace(out)
	}
	id := must("open", t.TempDir())
	// A turn of about eight seconds.
	fake.Script(fakemodel.Reply{Text: strings.Repeat("steady ", 80), ChunkSize: 7, Delay: 100 * time.Millisecond})
	run := startShoal(t, t.TempDir(), as, "run", "--wait", "40s", id, "Go on.")
	if _, err := fake.WaitRequests(t.Context(), 1); err != nil {
		t.Fatalf("the model was not asked for the turn: %v", err)
	}
	up.stop(syscall.SIGKILL)
	up = startShoal(t, filepath.Join(dir, "up"), nil, upArgs...)
	up.waitLine("shoal: ready")
	select {
	case <-run.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("shoal run still waits a minute after the coordinator came back, its turn long ended; it said:\n%s", run.stderrText())
	}
	if code := run.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("shoal run: exit %d:\n%s", code, run.stderrText())
	}
	if out := strings.Join(run.stdoutLines(), "\n"); !strings.Contains(out, "steady steady") {
		t.Errorf("shoal run printed %q, not the turn's answer", out)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(must("status", id)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Turn != 1 || rec.Held != 0 {
		t.Errorf("the agent numbered %d turns (%d held); one was asked for", rec.Turn, rec.Held)
	}
}
