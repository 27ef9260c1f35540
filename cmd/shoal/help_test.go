package main

import (
	"strings"
	"testing"
)

func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			code, stdout, stderr := runShoal(t, t.TempDir(), nil, args...)
			if code != 0 || !strings.HasPrefix(stdout, "Usage: shoal "+c.name) {
				t.Errorf("shoal %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
			}
		}
	}
	code, stdout, _ := runShoal(t, t.TempDir(), nil, "help")
	if code != 0 {
		t.Fatalf("shoal help exited %d", code)
	}
	for _, c := range commands() {
		if !strings.Contains(stdout, "  "+c.name+" ") {
			t.Errorf("shoal help does not list %s", c.name)
		}
	}
	if code, _, stderr := runShoal(t, t.TempDir(), nil); code != 2 || !strings.Contains(stderr, "Usage: shoal <command>") {
		t.Errorf("bare shoal: exit %d, stderr %q", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runShoal(t, t.TempDir(), nil, "version")
	if code != 0 || !strings.HasPrefix(stdout, "shoal ") || !strings.Contains(stdout, "go1.") {
		t.Fatalf("shoal version: exit %d, %q", code, stdout)
	}
}
