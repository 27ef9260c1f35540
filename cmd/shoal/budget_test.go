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
	// The run says why its turn was cancelled, as the stream does; or,
	// when the turn ended on its own as the interrupt came (a loaded
	// machine), that it ended past its budget: exit 7 either way (it
	// exited 1, "the turn failed", in a CI run).
	if code, _, errOut := c.shoal("run", id, "First."); code != exitCancelled ||
		!strings.Contains(errOut, "turn 1 was cancelled: turn 1 passed its budget: agent "+id+" has used ") && !strings.Contains(errOut, "(turn 1 ended on its own as it was being interrupted: its text is whole)") ||
		!strings.Contains(errOut, "of its budget of 10") {
		t.Fatalf("the first turn, past its budget as it ran: exit %d, %q", code, errOut)
	}
	if tail := c.must("tail", "--no-follow", id); !strings.Contains(tail, "turn 1 passed its budget: agent "+id+" has used ") ||
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
	if code, _, errOut := c.shoal("open", "--budget-tokens", "-5", t.TempDir()); code != exitUsage || !strings.Contains(errOut, "a budget is 0 (no limit) or more") {
		t.Errorf("a negative budget: exit %d, %q", code, errOut)
	}
	// The refusal names what was given wrong, not a tokens 0 never given.
	if code, _, errOut := c.shoal("budget", "set", "--fleet", "--usd", "nan"); code != exitUsage || !strings.Contains(errOut, "not NaN dollars") || strings.Contains(errOut, "tokens 0") {
		t.Errorf("a budget of NaN dollars: exit %d, %q", code, errOut)
	}
}

// An agent's budget covers every life of its id: a reopened agent's turns
// are held to what its earlier lives used too, `shoal budget` counts
// them, and `shoal status` tells this life's use (Kaimon's usage) from
// the earlier lives' (usage_before).
func TestAgentBudgetCoversEveryLife(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	dir := t.TempDir()
	c.fake.Script(fakemodel.Reply{Text: "first life", Usage: fakemodel.Usage{Input: 100, Output: 20}})
	id := c.must("open", "--id", "lives", "--budget-tokens", "1000", dir)
	if out := c.must("run", id, "Spend some."); out != "first life" {
		t.Fatalf("the first life's turn: %q", out)
	}
	c.must("close", id)
	c.must("open", "--id", id, dir)
	var rec struct {
		Usage       struct{ InputTokens, OutputTokens int64 }
		UsageBefore *struct{ InputTokens, OutputTokens int64 } `json:"usage_before"`
	}
	if err := json.Unmarshal([]byte(c.must("status", "--json", id)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Usage.InputTokens != 0 || rec.UsageBefore == nil || rec.UsageBefore.InputTokens != 100 || rec.UsageBefore.OutputTokens != 20 {
		t.Errorf("the second life's record: usage %+v, usage_before %+v; want 0 and the first life's 100 in, 20 out", rec.Usage, rec.UsageBefore)
	}
	if out := c.must("budget", id); !strings.Contains(out, "used 120 tokens") {
		t.Errorf("shoal budget of the reopened agent: %q, want the first life's 120 tokens", out)
	}
	c.must("budget", "set", id, "--tokens", "100")
	// A budget may be set before its agent is opened, and a mistyped id
	// is said so.
	if code, out, errOut := c.shoal("budget", "set", "nosuch", "--tokens", "5"); code != 0 || !strings.Contains(out, "agent nosuch: budget 5 tokens") ||
		!strings.Contains(errOut, "no agent has the id nosuch yet; the budget holds it once one is opened under it") {
		t.Errorf("a budget for an id no agent has: exit %d, %q, %q", code, out, errOut)
	}
	// Lifted before its agent was opened, it is lifted, and said so.
	if code, out, errOut := c.shoal("budget", "set", "nosuch", "--tokens", "0"); code != 0 || !strings.Contains(out, "agent nosuch: budget no limit") ||
		strings.Contains(errOut, "no such agent") || !strings.Contains(errOut, "no agent has the id nosuch yet (is it mistyped?)") || strings.Contains(errOut, "holds it") {
		t.Errorf("lifting the budget of an id no agent has: exit %d, %q, %q", code, out, errOut)
	}
	code, _, errOut := c.shoal("send", id, "More.")
	if code != exitUnavailable || !strings.Contains(errOut, "agent "+id+" has used 120 tokens of its budget of 100") {
		t.Errorf("a turn of the reopened agent past what its lives used: exit %d, %q", code, errOut)
	}
}
