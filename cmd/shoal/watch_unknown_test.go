package main

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
)

// shoal watch <agent> <typo>: an unknown agent is an error (exit 3), as
// it is to shoal tail. Watch said "reconnecting" to a fabric it never
// lost, forever, and printed nothing of the real agent's turn end.
func TestWatchWithAnUnknownAgent(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", t.TempDir())
	w := startShoal(t, t.TempDir(), c.client, "watch", id, "nosuch")
	// Bounds against a hang only: a CLI started under the race detector
	// on a loaded machine can take seconds to start and to follow.
	poll.Until(t, 60*time.Second, "shoal watch starts", func() bool {
		return strings.Contains(w.stderrText(), "shoal: watching")
	})
	time.Sleep(500 * time.Millisecond)
	c.must("run", id, "Hello.")
	deadline := time.After(60 * time.Second)
	for {
		select {
		case <-w.done:
			if code := w.cmd.ProcessState.ExitCode(); code != exitNotFound {
				t.Errorf("shoal watch %s nosuch: exit %d, want %d; stderr:\n%s", id, code, exitNotFound, w.stderrText())
			}
			return
		case l := <-w.lines:
			if strings.Contains(l, id+" turn_end turn 1") {
				return // the agent that is there is watched
			}
		case <-deadline:
			t.Fatalf("shoal watch %s nosuch neither exited nor reported %s's turn end in 60s; stdout %q, stderr:\n%s",
				id, id, w.stdoutLines(), w.stderrText())
		}
	}
}
