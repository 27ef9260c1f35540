package main

import (
	"strings"
	"testing"
)

// shoal close a b read as "close both" but closed a alone, printed
// "closed" and exited 0, leaving b running; interrupt did the same. They
// refuse the extra argument with exit 2, as every other one-agent verb.
func TestCloseAndInterruptRefuseASecondAgent(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	a := c.must("open", t.TempDir())
	b := c.must("open", t.TempDir())
	for _, verb := range []string{"interrupt", "close"} {
		code, out, errOut := c.shoal(verb, a, b)
		if code != exitUsage {
			t.Errorf("shoal %s %s %s: exit %d (want %d: unexpected argument), stdout %q, stderr %q", verb, a, b, code, exitUsage, out, errOut)
		}
	}
	if status := c.must("status", "--json", b); !strings.Contains(status, `"status": "dead"`) && !strings.Contains(status, `"status": "closed"`) {
		// b was named but is still alive: the command said "closed" all the same.
		if code, _, _ := c.shoal("close", a, b); code == exitOK {
			t.Errorf("shoal close %s %s exited 0 yet %s is still %s", a, b, b, between(status, `"status": "`, `"`))
		}
	}
}

// An agent the fabric does not know is exit 3 (help: "3 no such agent or
// node") whatever the output format: shoal close --json nosuch exited 0
// with {"closed": false}, and shoal set-model nosuch opus exited 1
// ("not switched") where status, send, interrupt and close exit 3.
func TestUnknownAgentIsExit3Everywhere(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	for _, args := range [][]string{
		{"close", "--json", "nosuch"},
		{"set-model", "nosuch", "opus"},
		{"set-model", "--json", "nosuch", "opus"},
	} {
		code, out, errOut := c.shoal(args...)
		if code != exitNotFound {
			t.Errorf("shoal %s: exit %d, want %d; stdout %q, stderr %q", strings.Join(args, " "), code, exitNotFound, out, errOut)
		}
	}
}

func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, to)
	return v
}
