package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
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
