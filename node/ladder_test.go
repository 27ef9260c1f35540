package node_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// signalRecord is one line the fake CLI's recorder wrote.
type signalRecord struct {
	what string
	at   time.Time
}

func readSignals(t *testing.T, path string) []signalRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []signalRecord
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		what, ns, ok := strings.Cut(l, " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			t.Fatalf("the fake CLI recorded %q", l)
		}
		out = append(out, signalRecord{what, time.Unix(0, n)})
	}
	return out
}

func names(recs []signalRecord) string {
	var s []string
	for _, r := range recs {
		s = append(s, r.what)
	}
	return strings.Join(s, " ")
}

// ladderAgent opens an agent of a signal-recording fake CLI mode, with
// the given wait per rung, and returns the fixture, the agent, its
// watcher, its pid and where its signals are recorded, once the fake has
// its handlers in place.
func ladderAgent(t *testing.T, mode string, wait time.Duration) (*fixture, string, *watcher, int, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "signals")
	cli := fakeCLI(mode, "SHOAL_FAKE_SIGFILE="+file)
	cli.StopWait = wait
	f := startNode(t, fixtureOptions{claude: cli})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "hello")
	w.until(0, "the result", isResult(1))
	poll.Until(t, 10*time.Second, "the fake CLI is ready for signals", func() bool {
		b, _ := os.ReadFile(file)
		return strings.HasPrefix(string(b), "ready ")
	})
	return f, id, w, pidOf(t, f, id), file
}

// A CLI that ignores stdin ending, SIGINT and SIGTERM is taken down the
// whole ladder of peers.md §1 in order: stdin closed, then SIGINT, then
// SIGTERM, each given the rung's wait, then SIGKILL for the group.
func TestStopLadderOrder(t *testing.T) {
	t.Parallel()
	const wait = 400 * time.Millisecond
	f, id, w, pid, file := ladderAgent(t, "signals", wait)
	rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	if err != nil || !rep.Closed {
		t.Fatalf("close: %+v %v", rep, err)
	}
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	// It ignored everything it could, so only the SIGKILL ended it.
	poll.Until(t, 10*time.Second, "the process group is gone", func() bool { return gone(pid) })
	recs := readSignals(t, file)
	if got := names(recs); got != "ready eof interrupt terminated" {
		t.Fatalf("the CLI saw %q, want stdin's end, then SIGINT, then SIGTERM", got)
	}
	// Each rung waited before the next: the ladder is not fired at once.
	// (Half the wait, as a process notices a signal a little late.)
	for i := 2; i < len(recs); i++ {
		if gap := recs[i].at.Sub(recs[i-1].at); gap < wait/2 {
			t.Errorf("%s came %s after %s; each rung waits %s", recs[i].what, gap, recs[i-1].what, wait)
		}
	}
	if errs := errorsOf(w.events()); len(errs) != 0 {
		t.Errorf("closing an agent reported errors: %q", errs)
	}
}

// A CLI that exits on SIGINT, as the real one does, is never sent SIGTERM:
// the ladder stops at the rung that worked. The fake takes 300ms to exit
// after SIGINT, so a SIGTERM sent without waiting for the rung would be
// seen.
func TestStopLadderStopsAtSIGINT(t *testing.T) {
	t.Parallel()
	f, id, w, pid, file := ladderAgent(t, "sigint", 2*time.Second)
	rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	if err != nil || !rep.Closed {
		t.Fatalf("close: %+v %v", rep, err)
	}
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	poll.Until(t, 10*time.Second, "the process group is gone", func() bool { return gone(pid) })
	if got := names(readSignals(t, file)); got != "ready eof interrupt" {
		t.Fatalf("the CLI saw %q, want stdin's end then SIGINT only", got)
	}
}
