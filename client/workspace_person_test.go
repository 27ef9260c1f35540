package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/schemas"
)

// personsGit gives the test a person: a HOME of their own holding
// gitconfig as their global configuration, a git-lfs on PATH (a stand-in
// that cleans a file to an LFS pointer, as the real one does), and
// returns a function running their git, with all of it, in a directory.
func personsGit(t *testing.T, gitconfig string) func(dir string, args ...string) string {
	t.Helper()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(gitconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(home, "bin")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "git-lfs"), []byte(`#!/bin/sh
case "$1" in
clean) d=$(mktemp); cat > "$d"
  if head -c 40 "$d" | grep -q '^version https://git-lfs'; then cat "$d"; else
    printf 'version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %s\n' "$(sha256sum < "$d" | cut -d' ' -f1)" "$(wc -c < "$d" | tr -d ' ')"
  fi; rm -f "$d";;
smudge) cat;;
esac
`), 0o755)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "GIT_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=me", "GIT_AUTHOR_EMAIL=me@example.invalid",
			"GIT_COMMITTER_NAME=me", "GIT_COMMITTER_EMAIL=me@example.invalid")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the person's git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
}

// A person who ran `git lfs install` (filter.lfs.* in their global
// configuration) edits a file their .gitattributes sends to LFS and opens
// an agent --with-changes. Their own git add stores a pointer; Shoal's git,
// reading none of their configuration, finds the filter undefined and
// stores the file's whole content: it is sent to the node, and comes back
// on shoal/<id> as a raw blob in an LFS path (which the person then
// merges and pushes). The same for a new file of that pattern.
func TestWithChangesStoresAnLFSFileAsThePersonsGitDoes(t *testing.T) {
	git := personsGit(t, "[filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n\tsmudge = git-lfs smudge -- %f\n\trequired = true\n")
	f := oneNodeFabric(t)
	repo := t.TempDir()
	git(repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, ".gitattributes"), []byte("*.bin filter=lfs diff=lfs merge=lfs -text\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "model.bin"), []byte(strings.Repeat("weights v1\n", 1000)), 0o644)
	git(repo, "add", ".")
	git(repo, "commit", "-qm", "model")
	if p := git(repo, "cat-file", "-p", "HEAD:model.bin"); !strings.HasPrefix(p, "version https://git-lfs") {
		t.Fatalf("the person's git stored model.bin as %q", p)
	}
	os.WriteFile(filepath.Join(repo, "model.bin"), []byte(strings.Repeat("weights v2\n", 1000)), 0o644)
	os.WriteFile(filepath.Join(repo, "extra.bin"), []byte(strings.Repeat("more\n", 1000)), 0o644)

	co := openOnRepo(t, f, "lfs", repo, true)
	os.WriteFile(filepath.Join(co, "notes.txt"), []byte("the agent's\n"), 0o644)
	got, err := f.Fetch(t.Context(), "lfs", "", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"model.bin", "extra.bin"} {
		if blob := git(repo, "cat-file", "-p", got.Branch+":"+p); !strings.HasPrefix(blob, "version https://git-lfs") {
			t.Errorf("%s on %s is %d bytes of the file's content, not the LFS pointer the person's git stores for it", p, got.Branch, len(blob))
		}
	}
}

// The same for line ends: with core.autocrlf in the person's global
// configuration (Git for Windows sets it; some set it on Linux and macOS)
// a file's CRLF lines are stored as LF. Shoal's git stores the edited
// file's CRLF as is: the agent's diff and shoal/<id> rewrite every line.
func TestWithChangesStoresLineEndsAsThePersonsGitDoes(t *testing.T) {
	git := personsGit(t, "[core]\n\tautocrlf = true\n")
	f := oneNodeFabric(t)
	repo := t.TempDir()
	git(repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("one\r\ntwo\r\nthree\r\n"), 0o644)
	git(repo, "add", ".")
	git(repo, "commit", "-qm", "a")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("one\r\ntwo\r\nthree\r\nfour\r\n"), 0o644)
	if st := git(repo, "diff", "--numstat"); st != "1\t0\ta.txt" {
		t.Fatalf("the person's git diff: %q", st)
	}
	openOnRepo(t, f, "crlf", repo, true)
	got, err := f.Fetch(t.Context(), "crlf", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if st := git(repo, "diff", "--numstat", "main", got.Branch); st != "1\t0\ta.txt" {
		t.Errorf("the person added one line to a.txt; %s against main: %q (stored %q)", got.Branch, st, git(repo, "cat-file", "-p", got.Branch+":a.txt"))
	}
}

// A repository the person's own git works in because their global
// configuration trusts it (safe.directory: a checkout owned by another
// user, a container's volume, a WSL mount): Shoal's git, reading none of
// that configuration, refuses it as "dubious ownership", and the open
// says the directory is "not in a git work tree". (Needs root, to give
// the repository to another user.)
func TestOpenOnARepositoryThePersonsGitTrusts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to give a repository to another user: run the suite as root (scripts/test does)")
	}
	git := personsGit(t, "[safe]\n\tdirectory = *\n")
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	filepath.Walk(repo, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 65534, 65534) })
	git(repo, "status", "--porcelain") // the person's git works there
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "trusted"}, client.RepoSource{Dir: repo}); err != nil {
		t.Errorf("an open on a repository the person's git trusts: %v", err)
	}
}

// The person's git ignores .env, *.log (their global excludes file) and
// build/ (the repository's .git/info/exclude); fcc56ad keeps them from
// being sent. What the agent writes by those names on the node (a .env
// it made to run the app, its test log, its build) came back committed on
// shoal/<id>: the node's git knows none of those patterns.
func TestFetchLeavesOutWhatThePersonsGitIgnores(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".config", "git"), 0o700)
	os.WriteFile(filepath.Join(home, ".config", "git", "ignore"), []byte(".env\n*.log\n"), 0o600)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	os.WriteFile(filepath.Join(repo, ".git", "info", "exclude"), []byte("build/\n"), 0o644)
	co := openOnRepo(t, f, "ignores", repo, false)
	agentShell(t, co, "mkdir build && echo bin > build/app && echo test > test.log && echo API_KEY=sk-live > .env && echo a2 > a.txt")
	got, err := f.Fetch(t.Context(), "ignores", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if files := gittest.Git(t, repo, "diff", "--name-only", "main", got.Branch); files != "a.txt" {
		t.Errorf("%s changes, against main:\n%s\nthe person's git ignores all but a.txt", got.Branch, files)
	}
	// The diff shows what the fetch brings: it showed the .env, the log
	// and the build the fetch left out.
	diff, err := f.Diff(t.Context(), "ignores", false)
	if err != nil {
		t.Fatal(err)
	}
	if diff.Files != 1 || strings.Contains(diff.Diff, "sk-live") || strings.Contains(diff.Diff, "build/app") || !strings.Contains(diff.Diff, "+a2") {
		t.Errorf("the agent's diff, %d files, shows what the person's git ignores, or not a.txt:\n%s", diff.Files, diff.Diff)
	}
}
