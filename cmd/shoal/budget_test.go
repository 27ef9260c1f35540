package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// An agent opened with --budget-tokens below one turn's usage begins that
// turn, which is interrupted as it crosses the budget (exit 7, an error
// event naming the budget); its next is refused before it begins (no
// turn_started), exit 4, naming the budget, what was used and how to
// raise it; raised, the agent goes on.
func TestBudgetRefusesATurnPastIt(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", "--budget-tokens", "10", t.TempDir())
	c.fake.Script(fakemodel.Reply{Text: "one"}, fakemodel.Reply{Text: "two"})
	if code, _, errOut := c.shoal("run", id, "First."); code != exitCancelled {
		t.Fatalf("the first turn, past its budget as it ran: exit %d, %q", code, errOut)
	}
	if tail := c.must("tail", "--no-follow", id); !strings.Contains(tail, "turn 1 was interrupted: agent "+id+" has used ") ||
		!strings.Contains(tail, "tokens of its budget of 10: raise it with shoal budget set "+id+" --tokens N") {
		t.Errorf("the stream does not say why turn 1 was interrupted:\n%s", tail)
	}
	for _, verb := range []string{"send", "run"} {
		code, _, errOut := c.shoal(verb, id, "Second.")
		if code != exitUnavailable || !strings.Contains(errOut, "agent "+id+" has used ") || !strings.Contains(errOut, "tokens of its budget of 10: raise it with shoal budget set "+id+" --tokens N") {
			t.Errorf("shoal %s past the budget: exit %d, %q", verb, code, errOut)
		}
	}
	started := 0
	sc := bufio.NewScanner(strings.NewReader(c.must("tail", "--json", "--no-follow", id)))
	for sc.Scan() {
		var line struct{ Kind string }
		json.Unmarshal(sc.Bytes(), &line)
		if line.Kind == "turn_started" {
			started++
		}
	}
	if started != 1 {
		t.Errorf("%d turns started, want the first alone", started)
	}
	if out := c.must("budget", "set", id, "--tokens", "1000000"); !strings.Contains(out, "budget 1000000 tokens; used ") {
		t.Errorf("shoal budget set: %q", out)
	}
	if out := c.must("run", id, "Second."); out != "two" {
		t.Errorf("the turn after the budget was raised: %q", out)
	}
	if code, _, errOut := c.shoal("open", "--budget-tokens", "-5", t.TempDir()); code != exitUsage || !strings.Contains(errOut, "a budget is not negative") {
		t.Errorf("a negative budget: exit %d, %q", code, errOut)
	}
}
