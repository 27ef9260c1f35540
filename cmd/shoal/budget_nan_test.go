package main

import (
	"strings"
	"testing"
)

// A budget of NaN or infinite dollars is no budget a turn can be held to:
// shoal budget set refuses it as a wrong command line (exit 2). It
// answered "budget no limit" with exit 0 and wrote a value nobody could
// decode, after which every turn the budget covered failed.
func TestBudgetSetRefusesNaNAndInfinity(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", t.TempDir())
	if out := c.must("run", id, "First."); out != "ok" {
		t.Fatalf("the first turn: %q", out)
	}
	for _, scope := range [][]string{{id}, {"--fleet"}} {
		for _, usd := range []string{"NaN", "Inf"} {
			args := append(append([]string{"budget", "set"}, scope...), "--usd", usd)
			code, out, errOut := c.shoal(args...)
			if code != exitUsage {
				t.Errorf("shoal %s: exit %d (want %d), stdout %q, stderr %q", strings.Join(args, " "), code, exitUsage, out, errOut)
			}
			// Whatever it answered, the agent's next turn must still run.
			if code, out, errOut := c.shoal("run", id, "Again."); code != exitOK {
				t.Errorf("a turn after shoal %s: exit %d, %q %q", strings.Join(args, " "), code, out, errOut)
			}
			c.must(append(append([]string{"budget", "set"}, scope...), "--tokens", "0")...) // lift it again
		}
	}
	// The same value given to an open is a wrong command line too, said
	// in Shoal's words rather than encoding/json's, with exit 2.
	if code, _, errOut := c.shoal("open", "--budget-usd", "NaN", t.TempDir()); code != exitUsage || strings.Contains(errOut, "json:") {
		t.Errorf("shoal open --budget-usd NaN: exit %d (want %d), %q", code, exitUsage, errOut)
	}
}

// shoal budget set names what it sets with --tokens and --usd; a flag
// left out leaves that limit as it is: setting the dollars of an agent
// limited to 100 tokens lifted its token limit, and shoal budget set
// <agent> with neither flag lifted every limit, exit 0. It is refused now.
func TestBudgetSetKeepsTheLimitItWasNotGiven(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	id := c.must("open", t.TempDir())
	if out := c.must("budget", "set", id, "--tokens", "100", "--usd", "5"); !strings.Contains(out, "budget 100 tokens, $5.0000") {
		t.Fatalf("shoal budget set --tokens 100 --usd 5: %q", out)
	}
	if out := c.must("budget", "set", id, "--usd", "3"); !strings.Contains(out, "100 tokens") {
		t.Errorf("shoal budget set %s --usd 3 lifted the token limit it was not given: %q", id, out)
	}
	c.must("budget", "set", id, "--tokens", "100", "--usd", "5")
	code, out, errOut := c.shoal("budget", "set", id)
	if after := c.must("budget", id); code != exitUsage || !strings.Contains(after, "100 tokens") {
		t.Errorf("shoal budget set %s with neither --tokens nor --usd: exit %d (%q %q), want %d; then %q", id, code, out, errOut, exitUsage, after)
	}
}

// shoal up --budget-usd NaN (or Inf) is refused as a negative budget is:
// it started, and every turn of the fleet then failed ("_fleet in
// shoal_budgets does not decode").
func TestUpRefusesANaNFleetBudget(t *testing.T) {
	t.Parallel()
	for _, usd := range []string{"NaN", "Inf", "-Inf"} {
		if code, _, errOut := runShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--no-mcp", "--no-bus", "--no-node", "--budget-usd", usd); code != exitUsage || !strings.Contains(errOut, "a finite number of dollars") {
			t.Errorf("shoal up --budget-usd %s: exit %d (want %d), %q", usd, code, exitUsage, errOut)
		}
	}
}
