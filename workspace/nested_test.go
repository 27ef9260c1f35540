package workspace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A `git init` in a directory that holds tracked files (a tool run in
// src/, a fixture made in place) does not stop git from taking the edits
// to those tracked files: `git status` shows them, and `git add --all`
// stages them. Only untracked repositories are left out of the commit of
// the work, as git lists them: the caller's --with-changes and the node's
// diff and fetch keep the edit (an outside review of the first version,
// which left out every directory holding a .git).
func TestNestedInitKeepsTrackedEditsWithChanges(t *testing.T) {
	ctx := t.Context()
	repo := newRepo(t)
	write(t, filepath.Join(repo, "src", "main.go"), "package main\n")
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "src")
	write(t, filepath.Join(repo, "src", "main.go"), "package main // edited\n")
	git(t, filepath.Join(repo, "src"), "init", "-q")
	if st := git(t, repo, "status", "--short"); !strings.Contains(st, "M src/main.go") {
		t.Fatalf("git itself should see the edit: %q", st)
	}
	s, err := Prepare(ctx, repo, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := showIn(t, repo, s, "src/main.go")
	if got != "package main // edited" {
		t.Errorf("--with-changes took src/main.go as %q; the person's edit (which git status shows) is lost", got)
	}
}

func TestNestedInitKeepsTrackedEditsInCheckoutDiff(t *testing.T) {
	ctx := t.Context()
	_, _, co := agentCheckout(t)
	// a.txt is tracked at the top; put a tracked file in a subdirectory.
	write(t, filepath.Join(co.Dir, "src", "main.go"), "package main\n")
	git(t, co.Dir, "add", ".")
	git(t, co.Dir, "commit", "-q", "-m", "src")
	base := git(t, co.Dir, "rev-parse", "HEAD")
	write(t, filepath.Join(co.Dir, "src", "main.go"), "package main // edited by the agent\n")
	git(t, filepath.Join(co.Dir, "src"), "init", "-q")
	d, err := co.Diff(ctx, base, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d, "edited by the agent") {
		t.Errorf("the diff of the agent's work lacks its edit of the tracked src/main.go:\n%s", d)
	}
}

// showIn reads path in the start's commit, whose objects are apart from
// the repository's.
func showIn(t *testing.T, repo string, s *Start, path string) string {
	t.Helper()
	cmd := exec.Command("git", "cat-file", "-p", s.Commit+":"+path)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GIT_ALTERNATE_OBJECT_DIRECTORIES="+strings.Join(s.objects, ":"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git cat-file %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

// A repository inside an ignored directory (a git dependency under
// node_modules) is no part of the work: git's add never goes there. The
// first version walked every directory, ignored or not, outside git and
// its bounds, and named such repositories as left out.
func TestNestedRepositoriesAreFoundAsGitFindsThem(t *testing.T) {
	repo := newRepo(t)
	write(t, filepath.Join(repo, ".gitignore"), "node_modules/\n")
	git(t, repo, "add", ".gitignore")
	git(t, repo, "commit", "-q", "-m", "ignore node_modules")
	for _, d := range []string{"node_modules/p1", "tools/scratch", "fixture"} {
		if err := os.MkdirAll(filepath.Join(repo, d), 0o755); err != nil {
			t.Fatal(err)
		}
		git(t, filepath.Join(repo, d), "init", "-q")
	}
	write(t, filepath.Join(repo, "tools", "t.txt"), "t\n")
	got, err := nestedRepositories(t.Context(), gitter{}, repo, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "fixture tools/scratch" {
		t.Errorf("the repositories of their own in the work tree: %q, want fixture and tools/scratch", got)
	}
}

// What --with-changes leaves out of the commit of the caller's work (a
// repository of its own inside it) was named only in that commit's
// message, which the caller never sees: the start says it, for the open
// to say (outside review).
func TestWithChangesSaysWhatItLeavesOut(t *testing.T) {
	repo := newRepo(t)
	write(t, filepath.Join(repo, "inner", "x.txt"), "x\n")
	git(t, filepath.Join(repo, "inner"), "init", "-q")
	write(t, filepath.Join(repo, "mine.txt"), "mine\n")
	s, err := Prepare(t.Context(), repo, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.LeftOut) != 1 || s.LeftOut[0] != "each a git repository of its own, which git keeps apart from this one: inner/" {
		t.Errorf("the start says it left out %q", s.LeftOut)
	}
	if got := showIn(t, repo, s, "mine.txt"); got != "mine" {
		t.Errorf("mine.txt in the start: %q", got)
	}
}
