package main

import (
	"strings"
	"testing"
)

// shoal job exits with the kind of its error whether or not it runs
// apart: a missing repository, or a directory that is no git work tree,
// is a wrong command line (exit 2) attached; with --detach the same
// mistakes exited 1 ("failure"), with a line that said the job's process
// "ended before the job began" and then that the job "started". Nor is
// such a job stored: one stored has begun, and --detach answers once it
// sees the record (a job stored and then failed made a detached job on a
// directory that is no work tree exit 0 now and then).
func TestDetachedJobExitsWithItsErrorsKind(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := t.TempDir() // not a git work tree
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--repo", "/nonexistent"}, exitUsage},
		{[]string{"--repo", repo}, exitUsage},
	} {
		args := append(append([]string{"job"}, tc.args...), "Do it.")
		attached, _, errA := c.shoal(args...)
		if attached != tc.code {
			t.Fatalf("shoal %s: exit %d, want %d (%q)", strings.Join(args, " "), attached, tc.code, errA)
		}
		detached, _, errD := c.shoal(append([]string{"job", "--detach"}, args[1:]...)...)
		if detached != attached || strings.Contains(errD, "ended before the job began") {
			t.Errorf("shoal job --detach %s: exit %d, where attached it exits %d; stderr %q", strings.Join(tc.args, " "), detached, attached, errD)
		}
	}
	if code, out, errOut := c.shoal("job", "ls", "--json"); code != 0 || strings.Contains(out, `"id"`) {
		t.Errorf("jobs that failed before they began are stored: shoal job ls exits %d: %s%s", code, out, errOut)
	}
}
