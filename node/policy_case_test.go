package node_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// The claude CLI matches the tool names of its flags in their case: run
// with --disallowedTools bash it runs Bash. So a child keeps its parent's
// denial only in the parent's spelling, and an allowlist entry covers a
// child's only in its own: a parent denied Bash could open a child that
// "kept" the denial as bash, and the CLI ran Bash for the child.
func TestChildKeepsItsParentsDenialsInTheCLIsCase(t *testing.T) {
	t.Parallel()
	compose := func(deny string) schemas.Policy {
		t.Helper()
		d := []string{deny}
		p, err := schemas.ComposePolicy("default", "", nil, &d, false)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cwd := t.TempDir()
	if err := compose("Bash").Record(cwd).Admits(compose("bash"), cwd); err == nil || !strings.Contains(err.Error(), "may not call Bash, so its child may not either") {
		t.Errorf("a child of a parent denied Bash, keeping the denial as bash: %v", err)
	}

	// Why: what the real CLI does with each spelling.
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	call := fakemodel.Reply{
		Text:      "I'll run a command.",
		ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"echo shoal-ok","description":"Print a marker"}`)}},
	}
	fake.Script(call, fakemodel.Reply{Text: "done"}, call, fakemodel.Reply{Text: "done"})
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	ran := func(deny string) bool {
		d := []string{deny}
		id := f.open(schemas.OpenRequest{DisallowedTools: &d})
		w := f.watch(id)
		f.send(id, "Check the machine.")
		end := w.until(0, "turn 1's result", isResult(1))
		for _, e := range w.events()[:end+1] {
			if p, ok := e.Payload.(schemas.ToolResult); ok && p.Update.Status != nil && *p.Update.Status == schemas.ToolCompleted &&
				len(p.Update.Content) > 0 && strings.Contains(p.Update.Content[0].Content.Text, "shoal-ok") {
				return true
			}
		}
		return false
	}
	if ran("Bash") {
		t.Errorf("the CLI ran Bash under --disallowedTools Bash")
	}
	if !ran("bash") {
		t.Errorf("the CLI refused Bash under --disallowedTools bash: it matches names in any case now, and Admits may too")
	}
}
