package main

import (
	"strings"
	"testing"
)

// A mistyped command or flag gets the nearest one named; something far
// from every name gets no guess.
func TestSuggestVerbsAndFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string // "" for no suggestion
	}{
		{[]string{"opne"}, `shoal: unknown command "opne"; did you mean open? (see shoal help)`},
		{[]string{"stauts", "x"}, "did you mean status?"},
		{[]string{"help", "tial"}, "did you mean tail?"},
		{[]string{"open", "--sandox"}, "shoal open: unknown flag --sandox; did you mean --sandbox? (see shoal open --help)"},
		{[]string{"up", "--log-fromat", "json"}, "did you mean --log-format?"},
		{[]string{"node", "--node-nmae", "x"}, "did you mean --node-name?"},
		{[]string{"xyzzy"}, ""},
		// A name other tools use for a verb gets the verb.
		{[]string{"list"}, `shoal: unknown command "list"; did you mean ls? (see shoal help)`},
		{[]string{"kill", "x"}, "did you mean close?"},
		{[]string{"open", "--frobnicate"}, ""},
		// A value given as a flag is pointed at its flag; a word two
		// edits from a short flag (new, raw) is not near it.
		{[]string{"tail", "--new", "x"}, "shoal tail: unknown flag --new; did you mean --from new? (see shoal tail --help)"},
		{[]string{"open", "--nod", "x"}, "did you mean --node?"},
		{[]string{"ls", "--jsn"}, "did you mean --json?"},
		{[]string{"ls", "--raw"}, ""},
	} {
		code, _, errOut := runShoal(t, t.TempDir(), nil, c.args...)
		if code != exitUsage || strings.Count(errOut, "\n") != 1 {
			t.Errorf("shoal %v: exit %d, %q; want exit %d and one line", c.args, code, errOut, exitUsage)
		}
		if c.want == "" && strings.Contains(errOut, "did you mean") || !strings.Contains(errOut, c.want) {
			t.Errorf("shoal %v said %q; want %q", c.args, errOut, c.want)
		}
	}
}

func TestSuggestEditDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		d    int
	}{
		{"open", "open", 0}, {"opne", "open", 1}, {"sandox", "sandbox", 1}, {"", "ls", 2},
		{"tial", "tail", 1}, {"kitten", "sitting", 3}, {"ca", "abc", 3},
	} {
		if got := editDistance(c.a, c.b); got != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.d)
		}
	}
	if got := nearest("sandbx", []string{"sandbox", "sandbox-net", "model"}); len(got) != 1 || got[0] != "sandbox" {
		t.Errorf("nearest sandbx = %v", got)
	}
}
