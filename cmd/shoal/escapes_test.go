package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// evilText is what a model (prompt-injected by a file it read, say)
// might answer to take over the terminal that shows it: retitle the
// window, clear the screen, an 8-bit CSI, write the clipboard.
const evilText = "plain \x1b]0;TITLEPWN\x1b\\ \x1b[2J\u009b31m \x1b]52;c;cHduZWQ=\x07 end"

// The verbs print what models, agents and nodes wrote without its escape
// sequences: shoal run and output (a model's answer), ls (a model name an
// agent's open gave), a command's error (a model's refusal). --json
// prints them escaped, as JSON does.
func TestVerbsPrintNoEscapesOfWhatAgentsWrote(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	c.fake.Script(fakemodel.Reply{Text: evilText})
	// A model's name is printable text: one with control characters is
	// refused, naming them.
	if code, _, errOut := c.shoal("open", "--model", "sonnet\nfake-row\tx", t.TempDir()); code == 0 || !strings.Contains(errOut, "a model name is printable text") {
		t.Errorf("an open whose model holds a line break: exit %d: %s", code, errOut)
	}
	// A directory's name may hold anything but a slash: ls shows it on
	// its row, in its cell, without its escapes.
	cwd := filepath.Join(t.TempDir(), "dir\x1b]0;LSPWN\x07\x1b[2J\nfake-row\tx")
	if err := os.Mkdir(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	inDir := c.must("open", cwd)
	if out := c.must("ls"); strings.Count(out, "\n") != 1 || !strings.Contains(out, `\nfake-row\tx`) {
		t.Errorf("shoal ls of an agent whose directory's name holds a line break and a tab: want a header and one row, the two written \\n and \\t:\n%q", out)
	}
	// The claude CLI takes a backslash in its directory's path for a
	// separator and exits at its first turn ("died during the turn"): an
	// open there is refused, saying why.
	slashed := filepath.Join(t.TempDir(), `back\slash`)
	if err := os.Mkdir(slashed, 0o755); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := c.shoal("open", slashed); code == 0 || !strings.Contains(errOut, "the claude CLI cannot work in") || !strings.Contains(errOut, "backslash") {
		t.Errorf("an open in a directory whose path holds a backslash: exit %d: %s", code, errOut)
	}
	id := c.must("open", t.TempDir())
	if code, _, errOut := c.shoal("set-model", id, "acp:x:y\nforged"); code == 0 || !strings.Contains(errOut, "a model name is printable text") {
		t.Errorf("a set-model whose model holds a line break: exit %d: %s", code, errOut)
	}
	for _, args := range [][]string{{"run", id, "Say it."}, {"output", id}, {"ls"}, {"status", inDir}} {
		code, out, errOut := c.shoal(args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		for _, bad := range []string{"\x1b", "\u009b", "\x07"} {
			if strings.Contains(out, bad) {
				t.Errorf("shoal %v printed %q of what an agent wrote:\n%q", args, bad, out)
			}
		}
		if (args[0] == "run" || args[0] == "output") && !strings.Contains(out, "plain") {
			t.Errorf("shoal %v printed no answer: %q", args, out)
		}
	}
	if out := c.must("output", "--json", id); !strings.Contains(out, `\u001b]0;TITLEPWN`) || !strings.Contains(out, `\u009b31m`) || strings.Contains(out, "\u009b") {
		t.Errorf("shoal output --json does not carry the answer as it was, escaped (C1 too): %q", out)
	}
	// An error that quotes the model: a failed turn's message on stderr,
	// and the run's exit says it failed.
	c.fake.Script(fakemodel.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorMessage: "refused " + evilText})
	code, out, errOut := c.shoal("run", id, "Fail.")
	if code != 1 || !strings.Contains(errOut, "shoal run: the turn failed: ") || !strings.Contains(errOut, "refused plain") || !strings.Contains(out, "refused plain") {
		t.Errorf("a run whose turn the model refused: exit %d: %q %q; want 1, its text, and the failure on stderr", code, out, errOut)
	}
	for _, bad := range []string{"\x1b", "\u009b", "\x07"} {
		if strings.Contains(errOut+out, bad) {
			t.Errorf("shoal run printed %q of what the model wrote:\n%q %q", bad, out, errOut)
		}
	}
	c.fake.Script(fakemodel.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorMessage: "refused " + evilText})
	// The repository's path is in the job's progress lines: a directory's
	// name is no more the terminal's to take.
	code, out, errOut = c.shoal("job", "--repo", oneCommitRepo(t, "repo\x1b]0;PATHPWN\x07\nforged", "one\n"), "Fail.")
	if code == 0 || !strings.Contains(errOut, "refused plain") || !strings.Contains(errOut, "repo forged") {
		t.Fatalf("a job whose turn the model refused: exit %d: %q %q", code, out, errOut)
	}
	if strings.Contains(errOut, "\nforged") {
		t.Errorf("a progress line was cut in two by the repository's path:\n%q", errOut)
	}
	for _, bad := range []string{"\x1b", "\u009b", "\x07"} {
		if strings.Contains(errOut, bad) {
			t.Errorf("shoal job's error printed %q of what the model wrote:\n%q", bad, errOut)
		}
	}
}
