package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
)

// A run whose turn waits on a permission request printed nothing for as
// long as nobody answered (up to --ask-timeout, ten minutes by default):
// it looked hung. It says on stderr what waits and the command that
// answers it, and once answered it ends as ever.
func TestRunSaysWhatItsTurnWaitsFor(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", "--permission", "ask", t.TempDir())
	in, _ := json.Marshal(map[string]string{"command": "echo asked", "description": "run it"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Done."})
	run := startShoal(t, t.TempDir(), c.client, "run", id, "Go.")
	said := regexp.MustCompile(`shoal: turn 1 waits for a person to answer Bash .*echo asked.*: shoal permit ` + id + ` (\S+) allow\|deny`)
	var request string
	poll.Until(t, 60*time.Second, "the run to say its turn waits for a person", func() bool {
		m := said.FindStringSubmatch(run.stderrText())
		if m != nil {
			request = m[1]
		}
		return m != nil
	})
	c.must("permit", id, request, "allow")
	select {
	case <-run.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the run did not end once its request was answered; stderr:\n%s", run.stderrText())
	}
	if code := run.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(strings.Join(run.stdoutLines(), "\n"), "Done.") {
		t.Errorf("the run after the answer: exit %d, %q\n%s", code, run.stdoutLines(), run.stderrText())
	}
}
