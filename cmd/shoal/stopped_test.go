package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// A `shoal run` stopped by one Ctrl-C while its turn runs is the person
// stopping the command, not an unreachable fabric: it exited 4
// (unavailable) with Go's "context canceled". It exits 130 and says the
// turn goes on, and how to stop it.
func TestRunStoppedByCtrlCSaysTheTurnGoesOn(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", "--permission", "bypass", t.TempDir())
	c.fake.Script(fakemodel.Reply{Text: "thinking it over", Hang: true})
	run := startShoal(t, t.TempDir(), c.client, "run", id, "Take your time.")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.fake.WaitRequests(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the run is waiting on the node
	code := run.stop(syscall.SIGINT)
	errOut := run.stderrText()
	if code != exitInterrupted || strings.Contains(errOut, "context canceled") || !strings.Contains(errOut, "shoal interrupt "+id) {
		t.Errorf("shoal run stopped by Ctrl-C: exit %d, %q; want exit %d saying the turn goes on and how to stop it", code, errOut, exitInterrupted)
	}
	c.must("interrupt", id)
}
