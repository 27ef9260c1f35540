package main

import (
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// shoal tail --json and --raw print an agent's events as JSON, as shoal
// output --json does; JSON leaves C1 controls (U+009B is a CSI, U+009D
// an OSC, to xterm and VTE in UTF-8) and bidirectional overrides as they
// are, so printJSON escapes them (schemas.EscapeUnreadable). tail's two
// JSON views must not write them to the terminal raw either.
func TestTailJSONAndRawEscapeC1AndBidi(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	// An 8-bit OSC 52 (clipboard write) ended by an 8-bit ST, an 8-bit
	// CSI that clears the screen, and a right-to-left override.
	const evil = "plain \u009d52;c;cHduZWQ=\u009c \u009b2J \u202eevil end"
	c.fake.Script(fakemodel.Reply{Text: evil})
	id := c.must("open", t.TempDir())
	c.must("run", id, "Say it.")
	if out := c.must("output", "--json", id); strings.Contains(out, "\u009d") || strings.Contains(out, "\u202e") {
		t.Fatalf("shoal output --json carries them raw too: %q", out)
	}
	for _, args := range [][]string{{"tail", "--no-follow", "--json", id}, {"tail", "--no-follow", "--raw", id}} {
		out := c.must(args...)
		if !strings.Contains(out, "plain") {
			t.Fatalf("shoal %v printed no answer: %q", args, out)
		}
		for _, bad := range []string{"\u009d", "\u009c", "\u009b", "\u202e"} {
			if strings.Contains(out, bad) {
				t.Errorf("shoal %v printed %q of what the model wrote, raw, to the terminal", args, bad)
			}
		}
	}
}
