// Package gittest runs real git for tests, apart from the machine's and
// the user's git configuration, with a fixed identity.
package gittest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Git runs git in dir and returns its output, trimmed; the test fails if
// git does.
func Git(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=me", "GIT_AUTHOR_EMAIL=me@example.invalid", "GIT_COMMITTER_NAME=me", "GIT_COMMITTER_EMAIL=me@example.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("git %v in %s: %v\n%s", args, dir, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Repo makes a repository in a new directory of the test's, on branch
// main, with one commit of file holding content, and returns it.
func Repo(tb testing.TB, file, content string) string {
	tb.Helper()
	dir := tb.TempDir()
	Git(tb, dir, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
	Git(tb, dir, "add", ".")
	Git(tb, dir, "commit", "-q", "-m", "first")
	return dir
}
