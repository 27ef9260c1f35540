package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// git runs real git in dir for the test, as a person would.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=p", "GIT_AUTHOR_EMAIL=p@x", "GIT_COMMITTER_NAME=p", "GIT_COMMITTER_EMAIL=p@x")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newRepo makes a caller's repository with two commits and an ignore rule.
func newRepo(t *testing.T) string {
	return newRepoAt(t, t.TempDir(), "sha1")
}

// newRepoAt is newRepo in dir, its objects named by format.
func newRepoAt(t *testing.T, dir, format string) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main", "--object-format="+format)
	write(t, filepath.Join(dir, "a.txt"), "one\n")
	write(t, filepath.Join(dir, ".gitignore"), "*.log\n")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "first")
	write(t, filepath.Join(dir, "a.txt"), "one\ntwo\n")
	git(t, dir, "commit", "-q", "-am", "second")
	return dir
}

// state is what a person sees of their repository: HEAD, the index, the
// status, the stash and the refs.
func state(t *testing.T, dir string) string {
	return strings.Join([]string{git(t, dir, "rev-parse", "HEAD"), git(t, dir, "ls-files", "-s"),
		git(t, dir, "status", "--porcelain=v1", "--untracked-files=all"), git(t, dir, "stash", "list"),
		git(t, dir, "for-each-ref")}, "\n--\n")
}

// A round trip: the caller's work with its uncommitted changes goes to a
// cache, an agent's checkout starts on it, the agent's work comes back as
// a branch; the caller's checkout is as it was throughout. So for a
// repository of SHA-256 objects (once refused as "not in the
// repository"), and for one whose path holds a colon, a newline and a
// quote (its objects once read from "…/client" and "acme/…", git's lists
// of object directories being colon- and line-separated).
func TestRoundTrip(t *testing.T) {
	for _, c := range []struct{ name, format, dir string }{
		{"sha1", "sha1", "app"},
		{"sha256", "sha256", "app"},
		{"a path of a colon, a newline and a quote", "sha1", "client:acme\n\"x\"/app"},
	} {
		t.Run(c.name, func(t *testing.T) { roundTrip(t, newRepoAt(t, filepath.Join(t.TempDir(), c.dir), c.format)) })
	}
}

func roundTrip(t *testing.T, repo string) {
	ctx := context.Background()
	write(t, filepath.Join(repo, "a.txt"), "one\ntwo\nedited\n")
	write(t, filepath.Join(repo, "new.txt"), "untracked\n")
	write(t, filepath.Join(repo, "x.log"), "ignored\n")
	before := state(t, repo)

	s, err := Prepare(ctx, filepath.Join(repo), "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Root != repo {
		t.Fatalf("the start's repository is %q, not %q", s.Root, repo)
	}
	if s.Commit == s.Base || s.Base != git(t, repo, "rev-parse", "HEAD") {
		t.Fatalf("start %+v: want a commit of the changes on top of HEAD", s)
	}
	if s.Repo != git(t, repo, "rev-list", "--max-parents=0", "HEAD") {
		t.Fatalf("identity %s is not the root commit", s.Repo)
	}
	cache := &Cache{Dir: t.TempDir()}
	has, haves, err := cache.Has(ctx, s.Repo, s.Commit)
	if err != nil || has || len(haves) != 0 {
		t.Fatalf("an empty cache: %v %v %v", has, haves, err)
	}
	b := filepath.Join(t.TempDir(), "b")
	n, err := s.Bundle(ctx, haves, b)
	if err != nil || n != 3 {
		t.Fatalf("first bundle: %d commits, %v; want 3", n, err)
	}
	if err := cache.Receive(ctx, s.Repo, b, s.Commit); err != nil {
		t.Fatal(err)
	}
	if has, _, err := cache.Has(ctx, s.Repo, s.Commit); err != nil || !has {
		t.Fatalf("the cache lacks the commit it received: %v", err)
	}
	if got := state(t, repo); got != before {
		t.Fatalf("the caller's repository changed:\n%s\nwas\n%s", got, before)
	}

	co := filepath.Join(t.TempDir(), "work", "a1")
	if err := cache.Checkout(ctx, s.Repo, s.Commit, co, "shoal/a1", "agent a1", "a1@shoal"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a.txt": "one\ntwo\nedited\n", "new.txt": "untracked\n"} {
		if b, err := os.ReadFile(filepath.Join(co, name)); err != nil || string(b) != want {
			t.Fatalf("checkout's %s: %q %v", name, b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(co, "x.log")); !os.IsNotExist(err) {
		t.Fatalf("an ignored file travelled: %v", err)
	}
	// The agent commits one file and leaves another uncommitted.
	write(t, filepath.Join(co, "committed.txt"), "c\n")
	git(t, co, "add", "committed.txt")
	git(t, co, "-c", "user.name=agent a1", "-c", "user.email=a1@shoal", "commit", "-q", "-m", "agent commit")
	write(t, filepath.Join(co, "loose.txt"), "l\n")
	d, err := Checkout{Dir: co}.Diff(ctx, s.Commit, false)
	if err != nil || !strings.Contains(d, "+c") || !strings.Contains(d, "+l") || !strings.Contains(d, "b/loose.txt") {
		t.Fatalf("diff: %v\n%s", err, d)
	}
	if c, err := (Checkout{Dir: co}).Changed(ctx, s.Commit); err != nil || c != 2 {
		t.Fatalf("changed: %d %v", c, err)
	}
	// A file renamed is one file changed, in the count as in the stat
	// printed under it (it was two in the count: a job said "3 files
	// changed" over a stat that ended "2 files changed").
	if err := os.Rename(filepath.Join(co, "a.txt"), filepath.Join(co, "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	c, err := (Checkout{Dir: co}).Changed(ctx, s.Commit)
	stat, serr := Checkout{Dir: co}.Diff(ctx, s.Commit, true)
	if err != nil || serr != nil || c != 3 || !strings.Contains(stat, " 3 files changed") {
		t.Fatalf("changed with a rename: %d %v; the stat (%v):\n%s", c, err, serr, stat)
	}
	if err := os.Rename(filepath.Join(co, "renamed.txt"), filepath.Join(co, "a.txt")); err != nil {
		t.Fatal(err)
	}
	tip, err := Checkout{Dir: co}.Snapshot(ctx, "uncommitted work of a1", "agent a1", "a1@shoal")
	if err != nil {
		t.Fatal(err)
	}
	wb := filepath.Join(t.TempDir(), "w")
	if n, err := (Checkout{Dir: co}).BundleWork(ctx, tip, []string{s.Base}, wb); err != nil || n != 3 {
		t.Fatalf("work bundle: %d %v; want the changes, the agent's commit and its uncommitted work", n, err)
	}
	if err := Land(ctx, repo, wb, tip, "shoal/a1", false); err != nil {
		t.Fatal(err)
	}
	if got := git(t, repo, "show", "shoal/a1:loose.txt"); got != "l" {
		t.Fatalf("landed branch: %q", got)
	}
	if st := git(t, repo, "status", "--porcelain=v1", "--untracked-files=all"); !strings.Contains(st, "new.txt") || strings.Contains(st, "loose") {
		t.Fatalf("the caller's work tree changed: %s", st)
	}

	// A second start after a new commit sends that commit only.
	git(t, repo, "stash", "-u", "-q")
	write(t, filepath.Join(repo, "b.txt"), "b\n")
	git(t, repo, "add", "b.txt")
	git(t, repo, "commit", "-q", "-m", "third")
	s2, err := Prepare(ctx, repo, "", false)
	if err != nil {
		t.Fatal(err)
	}
	has, haves, err = cache.Has(ctx, s2.Repo, s2.Commit)
	if err != nil || has || len(haves) != 1 {
		t.Fatalf("the cache's haves: %v %v %v", has, haves, err)
	}
	if n, err := s2.Bundle(ctx, haves, filepath.Join(t.TempDir(), "b2")); err != nil || n != 1 {
		t.Fatalf("second bundle: %d commits, %v; want 1", n, err)
	}
}

// What cannot be a start is refused, saying why.
func TestPrepareRefuses(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	empty := t.TempDir()
	git(t, empty, "init", "-q")
	bare := filepath.Join(t.TempDir(), "bare.git")
	git(t, repo, "clone", "-q", "--bare", repo, bare)
	for _, c := range []struct {
		dir, ref string
		changes  bool
		want     string
	}{
		{t.TempDir(), "", false, "not in a git work tree"},
		{filepath.Join(repo, "nope"), "", false, "does not exist"},
		{filepath.Join(repo, "a.txt"), "", false, "not a directory"},
		{empty, "", false, "has no commit yet"},
		{bare, "", false, "is a bare repository, which has no files to work on: open the agent on a work tree of it (git worktree add DIR)"},
		{repo, "no-such-branch", false, "names no commit"},
		{repo, "main", true, "cannot be given with a ref"},
	} {
		if _, err := Prepare(ctx, c.dir, c.ref, c.changes); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Prepare(%s, %q, %v): %v, want %q", c.dir, c.ref, c.changes, err, c.want)
		}
	}
}

// A fetch --into a bare repository says it is one, not that it is no
// work tree (outside review).
func TestLandRefusesABareRepository(t *testing.T) {
	repo := newRepo(t)
	bare := filepath.Join(t.TempDir(), "bare.git")
	git(t, repo, "clone", "-q", "--bare", repo, bare)
	err := Land(context.Background(), bare, filepath.Join(t.TempDir(), "none"), strings.Repeat("a", 40), "shoal/x", false)
	if err == nil || !strings.Contains(err.Error(), "is a bare repository: fetch --into a work tree of it") {
		t.Errorf("Land into a bare repository: %v", err)
	}
}

// Available names git's version here, where the tests run real git.
func TestAvailable(t *testing.T) {
	v, err := Available(context.Background())
	if err != nil || v == "" || !strings.Contains(v, ".") {
		t.Fatalf("Available: %q %v", v, err)
	}
}

// agentCheckout is a caller's repository at its HEAD, the start of an
// agent on it, and agent a1's checkout of it on a node, as the node makes
// it.
func agentCheckout(t *testing.T) (repo string, s *Start, co Checkout) {
	t.Helper()
	ctx := context.Background()
	repo = newRepo(t)
	s, err := Prepare(ctx, repo, "", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	cache := &Cache{Dir: t.TempDir()}
	b := filepath.Join(t.TempDir(), "b")
	if _, err := s.Bundle(ctx, nil, b); err != nil {
		t.Fatal(err)
	}
	if err := cache.Receive(ctx, s.Repo, b, s.Commit); err != nil {
		t.Fatal(err)
	}
	co = Checkout{Dir: filepath.Join(t.TempDir(), "a1")}
	if err := cache.Checkout(ctx, s.Repo, s.Commit, co.Dir, "shoal/a1", "shoal agent a1", "a1@shoal.invalid"); err != nil {
		t.Fatal(err)
	}
	return repo, s, co
}

// A fetch moves the agent's branch in the caller's repository past what
// Shoal made on it before (each fetch's commit of the uncommitted work is
// new), but not past a person's own commit on it, nor past an agent's
// commit a person amended (git keeps its author, the agent's: it was
// taken for Shoal's and dropped), nor while a linked work tree has it
// checked out: git fetch into the branch forced it along, and the
// person's commit was left to the reflog.
func TestLandKeepsWhatIsNotShoals(t *testing.T) {
	ctx := context.Background()
	repo, s, co := agentCheckout(t)
	force := false
	fetch := func(content string) (string, error) {
		t.Helper()
		write(t, filepath.Join(co.Dir, "loose.txt"), content)
		tip, err := co.Snapshot(ctx, SnapshotMessage("a1", "n1", 1), "shoal agent a1", "a1@shoal.invalid")
		if err != nil {
			t.Fatal(err)
		}
		wb := filepath.Join(t.TempDir(), "w")
		if _, err := co.BundleWork(ctx, tip, []string{s.Base}, wb); err != nil {
			t.Fatal(err)
		}
		return tip, Land(ctx, repo, wb, tip, "shoal/a1", force)
	}
	if _, err := fetch("1\n"); err != nil {
		t.Fatal(err)
	}
	tip2, err := fetch("2\n")
	if err != nil {
		t.Fatalf("a second fetch, past Shoal's commit of the first: %v", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != tip2 {
		t.Fatalf("shoal/a1 at %s after the second fetch, want %s", got, tip2)
	}

	// A person's commit on the branch.
	tree := git(t, repo, "rev-parse", "shoal/a1^{tree}")
	mine := git(t, repo, "commit-tree", tree, "-p", "shoal/a1", "-m", "my fix")
	git(t, repo, "update-ref", "refs/heads/shoal/a1", mine)
	if _, err := fetch("3\n"); err == nil || !strings.Contains(err.Error(), "my fix") || !strings.Contains(err.Error(), "has 1 commit the agent's") {
		t.Errorf("a fetch over a person's commit on the branch: %v; want a refusal naming it", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != mine {
		t.Errorf("the person's commit is gone from shoal/a1 (at %s, not %s)", got, mine)
	}

	// An agent's commit a person amended: its author is still the agent.
	git(t, repo, "update-ref", "refs/heads/shoal/a1", tip2)
	amend := filepath.Join(t.TempDir(), "amend")
	git(t, repo, "worktree", "add", "-q", amend, "shoal/a1")
	write(t, filepath.Join(amend, "loose.txt"), "my careful fix\n")
	git(t, amend, "commit", "-q", "-a", "--amend", "--no-edit")
	amended := git(t, amend, "rev-parse", "HEAD")
	git(t, amend, "checkout", "-q", "--detach")
	if _, err := fetch("5\n"); err == nil || !strings.Contains(err.Error(), "not made by Shoal") {
		t.Errorf("a fetch over an agent's commit a person amended: %v; want a refusal", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != amended {
		t.Errorf("the amended commit is gone from shoal/a1 (at %s, not %s)", got, amended)
	}

	// The branch checked out in a linked work tree.
	git(t, repo, "update-ref", "refs/heads/shoal/a1", tip2)
	linked := filepath.Join(t.TempDir(), "linked")
	git(t, repo, "worktree", "add", "-q", linked, "shoal/a1")
	if _, err := fetch("4\n"); err == nil || !strings.Contains(err.Error(), "checked out in a work tree") {
		t.Errorf("a fetch onto a branch a linked work tree has checked out: %v; want a refusal", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != tip2 {
		t.Errorf("a branch checked out in a linked work tree moved to %s", got)
	}
	git(t, repo, "worktree", "remove", "--force", linked)

	// The agent's own commit, fetched; then the agent drops it (a reset,
	// or a checkout lost and begun anew): the fetch is refused, naming
	// it, until it is forced, and the branch's reflog says what the
	// forced move left.
	write(t, filepath.Join(co.Dir, "work.txt"), "the agent's work\n")
	git(t, co.Dir, "add", "work.txt")
	agentCommit := exec.Command("git", "commit", "-q", "-m", "the agent's careful work")
	agentCommit.Dir = co.Dir
	agentCommit.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=shoal agent a1", "GIT_AUTHOR_EMAIL=a1@shoal.invalid",
		"GIT_COMMITTER_NAME=shoal agent a1", "GIT_COMMITTER_EMAIL=a1@shoal.invalid")
	if out, err := agentCommit.CombinedOutput(); err != nil {
		t.Fatalf("the agent's commit: %v\n%s", err, out)
	}
	git(t, repo, "update-ref", "refs/heads/shoal/a1", tip2)
	withWork, err := fetch("6\n")
	if err != nil {
		t.Fatalf("a fetch of the agent's commit: %v", err)
	}
	git(t, co.Dir, "reset", "-q", "--hard", "HEAD~1")
	if _, err := fetch("7\n"); err == nil || !strings.Contains(err.Error(), "1 of the agent's commits that its work no longer holds") ||
		!strings.Contains(err.Error(), "the agent's careful work") || !strings.Contains(err.Error(), "--force") {
		t.Errorf("a fetch leaving the agent's commit fetched before: %v; want a refusal naming it and --force", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != withWork {
		t.Errorf("shoal/a1 moved to %s, leaving the agent's commit fetched before (%s)", got, withWork)
	}
	force = true
	forced, err := fetch("8\n")
	if err != nil {
		t.Fatalf("a forced fetch: %v", err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != forced {
		t.Errorf("after a forced fetch shoal/a1 is at %s, want %s", got, forced)
	}
	if got := git(t, repo, "reflog", "-1", "--format=%gs", "shoal/a1"); !strings.Contains(got, "leaving 1 of its commits fetched before") {
		t.Errorf("the branch's reflog says %q of the forced move", got)
	}
}

// What the node takes of a git reading an agent's checkout is bounded:
// the agent's files may be any size (hard links make them cheap on its
// disk), and the node held a diff's output whole in memory.
func TestCheckoutReadsAreBounded(t *testing.T) {
	ctx := context.Background()
	_, s, co := agentCheckout(t)
	write(t, filepath.Join(co.Dir, "big.txt"), strings.Repeat("a line of the agent's\n", (MaxOutput/22)+1024))
	if _, err := co.Diff(ctx, s.Commit, false); !errors.Is(err, ErrTooMuch) {
		t.Errorf("the diff of a file past %d bytes: %v; want ErrTooMuch", MaxOutput, err)
	}
	if d, err := co.Diff(ctx, s.Commit, true); err != nil || !strings.Contains(d, "big.txt") {
		t.Errorf("its stat: %q %v", d, err)
	}
}

// A commit whose trees name one blob, and one tree, many times over (a
// "git bomb": a few kilobytes of objects, terabytes checked out) is not
// checked out: an agent's work, carried to another node, is checked out
// there from what the agent made.
func TestACheckoutIsBoundedByItsTree(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	big := filepath.Join(t.TempDir(), "big")
	write(t, big, strings.Repeat("x", 1<<20))
	blob := git(t, repo, "hash-object", "-w", big)
	mk := func(mode, kind, obj string) string {
		var lines strings.Builder
		for i := range 64 {
			fmt.Fprintf(&lines, "%s %s %s\tf%d\n", mode, kind, obj, i)
		}
		cmd := exec.Command("git", "mktree")
		cmd.Dir, cmd.Stdin = repo, strings.NewReader(lines.String())
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	tree := mk("100644", "blob", blob) // 64 MiB
	for range 3 {
		tree = mk("040000", "tree", tree) // 4 GiB, 256 GiB, 16 TiB
	}
	bomb := git(t, repo, "commit-tree", tree, "-p", "HEAD", "-m", "bomb")
	git(t, repo, "update-ref", "refs/heads/bomb", bomb)
	s, err := Prepare(ctx, repo, "bomb", false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cache := &Cache{Dir: t.TempDir()}
	b := filepath.Join(t.TempDir(), "b")
	if _, err := s.Bundle(ctx, nil, b); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(b); err != nil || fi.Size() > 4<<20 {
		t.Fatalf("the bomb's bundle: %v %v; want a small one", fi, err)
	}
	dst := filepath.Join(t.TempDir(), "a1")
	err = cache.CheckoutBundle(ctx, s.Repo, b, s.Commit, dst, "shoal/a1", "shoal agent a1", "a1@shoal.invalid")
	if err == nil || !strings.Contains(err.Error(), "not checked out") {
		t.Fatalf("the checkout of a commit of 16 TiB of files: %v; want a refusal", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("the refused checkout left %s: %v", dst, err)
	}
}

// What a node sends as "the bundle of the agent's work" is any bytes it
// likes. Land hands the file to git fetch as is, and git takes a file
// that is not a bundle as the path of a repository: a one-line gitfile
// ("gitdir: /some/repo/.git") makes the caller's git run upload-pack in
// any repository of the caller's machine the node names, and Land puts
// on shoal/<id> what it finds there. A bundle is what comes back, and
// nothing else may be read.
func TestLandTakesOnlyABundle(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)

	// Another repository of the caller's machine (here one holding the
	// ref name Shoal's bundles carry, as Shoal's own temporary bundle
	// repositories do while they exist).
	other := t.TempDir()
	git(t, other, "init", "-q", "-b", "main")
	write(t, filepath.Join(other, "secret.txt"), "not the agent's\n")
	git(t, other, "add", ".")
	git(t, other, "commit", "-q", "-m", "another repository's commit")
	tip := git(t, other, "rev-parse", "HEAD")
	git(t, other, "update-ref", bundleRef, tip)

	notABundle := filepath.Join(t.TempDir(), "work.bundle")
	if err := os.WriteFile(notABundle, []byte("gitdir: "+filepath.Join(other, ".git")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Land(ctx, repo, notABundle, tip, "shoal/a1", false)
	if err != nil && !strings.Contains(err.Error(), "not a git bundle") {
		t.Errorf("Land of a file that is not a bundle: %v; want it named so", err)
	}
	if err == nil {
		got := git(t, repo, "log", "--format=%s", "-1", "shoal/a1")
		t.Fatalf("Land took a file that is not a bundle (a gitfile naming %s) and put shoal/a1 at that repository's commit %q", other, got)
	}
}

// A caller's repository whose path holds a newline is taken for another
// one: Prepare (and Land) read git rev-parse --show-toplevel through
// line(), which keeps the first line of the path, so "…/app\nx" is
// opened as "…/app" when that is a repository too — its commits are
// what is sent, and a fetch --into lands there.
func TestPrepareTakesTheRepositoryItIsGivenWhateverItsPath(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	other := filepath.Join(parent, "app")
	for _, d := range []string{other, filepath.Join(parent, "app\nx")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		git(t, d, "init", "-q", "-b", "main")
		write(t, filepath.Join(d, "a.txt"), d+"\n")
		git(t, d, "add", ".")
		git(t, d, "commit", "-q", "-m", "first of "+filepath.Base(d))
	}
	dir := filepath.Join(parent, "app\nx")
	s, err := Prepare(ctx, dir, "", false)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer s.Close()
	if s.Root != dir || s.Base != git(t, dir, "rev-parse", "HEAD") {
		t.Fatalf("Prepare of %q took repository %q, at commit %.12s (the named one is at %.12s)", dir, s.Root, s.Base, git(t, dir, "rev-parse", "HEAD"))
	}
}

// The node's first read of an agent's checkout (the date of its HEAD, for
// the snapshot) ran git with the checkout's own configuration: an agent
// that signed its HEAD and set log.showSignature and a gpg.program of its
// own had the node run that program (outside the agent's sandbox, given
// a writable TMPDIR), and its words taken for the date broke diff and
// fetch. Nothing the checkout configures runs; the snapshot is made.
func TestSnapshotRunsNothingTheCheckoutConfigures(t *testing.T) {
	ctx := context.Background()
	_, _, co := agentCheckout(t)
	ran := filepath.Join(t.TempDir(), "ran")
	program := filepath.Join(co.Dir, ".git", "g.sh")
	write(t, program, "#!/bin/sh\ntouch "+ran+"\necho '[GNUPG:] GOODSIG 0 x'\n")
	os.Chmod(program, 0o755)
	git(t, co.Dir, "config", "log.showSignature", "true")
	git(t, co.Dir, "config", "gpg.program", program)
	head := git(t, co.Dir, "rev-parse", "HEAD")
	tree := git(t, co.Dir, "rev-parse", "HEAD^{tree}")
	signed := "tree " + tree + "\nparent " + head + "\nauthor a <a1@shoal.invalid> 1700000000 +0000\ncommitter a <a1@shoal.invalid> 1700000000 +0000\n" +
		"gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n\nsigned\n"
	cmd := exec.Command("git", "hash-object", "-t", "commit", "-w", "--stdin")
	cmd.Dir, cmd.Stdin = co.Dir, strings.NewReader(signed)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	git(t, co.Dir, "update-ref", "HEAD", strings.TrimSpace(string(out)))
	write(t, filepath.Join(co.Dir, "loose.txt"), "work\n")
	if _, err := co.Snapshot(ctx, SnapshotMessage("a1", "n1", 1), "shoal agent a1", "a1@shoal.invalid"); err != nil {
		t.Fatalf("the snapshot of a checkout whose HEAD is signed: %v", err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the snapshot ran the gpg.program the checkout's configuration names")
	}
}

// A git the node runs on an agent's checkout (jailed) is given the
// node's PATH and time zone, not its tokens: should anything the agent
// wrote make it run a program, that program reads none of them.
func TestJailedGitGetsNoneOfTheNodesSecrets(t *testing.T) {
	t.Setenv("SHOAL_MCP_TOKEN", "secret")
	env := gitEnv(true, []string{"GIT_DIR=/x"})
	for _, kv := range env {
		if strings.HasPrefix(kv, "SHOAL_") {
			t.Errorf("a jailed git is given %s", kv)
		}
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) || !slices.Contains(env, "GIT_DIR=/x") {
		t.Errorf("a jailed git's environment lacks PATH or what it was given: %q", env)
	}
	if !slices.Contains(cleanEnv(nil), "SHOAL_MCP_TOKEN=secret") {
		t.Error("a git run for the caller lost the caller's environment")
	}
}

// A person's branch named shoal keeps git from making shoal/<id>: the
// fetch says so, naming the branch and what to do, not git's own words.
func TestLandSaysABranchShoalIsInTheWay(t *testing.T) {
	ctx := context.Background()
	repo, s, co := agentCheckout(t)
	git(t, repo, "branch", "shoal")
	write(t, filepath.Join(co.Dir, "loose.txt"), "1\n")
	tip, err := co.Snapshot(ctx, SnapshotMessage("a1", "n1", 1), "shoal agent a1", "a1@shoal.invalid")
	if err != nil {
		t.Fatal(err)
	}
	wb := filepath.Join(t.TempDir(), "w")
	if _, err := co.BundleWork(ctx, tip, []string{s.Base}, wb); err != nil {
		t.Fatal(err)
	}
	err = Land(ctx, repo, wb, tip, "shoal/a1", false)
	if err == nil || !strings.Contains(err.Error(), "a branch shoal is there") || !strings.Contains(err.Error(), "git branch -m shoal") {
		t.Fatalf("a fetch into a repository with a branch shoal: %v", err)
	}
}
