package client_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// oneNodeFabric is a fabric with one node, a, and a caller on it.
func oneNodeFabric(t *testing.T) *client.Direct {
	t.Helper()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// tellingFabric is a fabric with a fake node of each name, and a client
// whose progress lines are kept in said.
func tellingFabric(t *testing.T, names ...string) (f *client.Direct, said *[]string) {
	t.Helper()
	srv := natstest.Start(t)
	for _, name := range names {
		fabrictest.Node(t, srv, node.Config{Name: name, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	}
	said = new([]string)
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{Progress: func(l string) { *said = append(*said, l) }})
	if err != nil {
		t.Fatal(err)
	}
	return f, said
}

// openOnRepo opens agent id on repo and returns its checkout on the node.
func openOnRepo(t *testing.T, f *client.Direct, id, repo string, withChanges bool) string {
	t.Helper()
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: id}, client.RepoSource{Dir: repo, WithChanges: withChanges}); err != nil {
		t.Fatal(err)
	}
	rec, err := f.Record(t.Context(), id)
	if err != nil || rec.Workspace == nil {
		t.Fatalf("the agent's record: %+v %v", rec, err)
	}
	return rec.Workspace.Dir
}

// git as the checkout configures it.
func agentShell(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// and shoal/<id> holds the committed content: the last edit is lost.
func TestFetchBringsBackAnEditMadeJustAfterACommit(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "racy", repo, false)
	// Begin at the start of a second, so the commit and the edit share one.
	// (On a loaded machine a try may straddle two seconds: tried again.)
	agentShell(t, co, `for try in 1 2 3 4 5 6 7 8; do
  s=$(date +%s); while [ "$(date +%s)" = "$s" ]; do :; done
  began=$(date +%s)
  echo version=1 > conf.txt && git add conf.txt && git commit -q --allow-empty -m conf && echo version=2 > conf.txt
  [ "$(stat -c %Y conf.txt)" = "$began" ] && exit 0
done
echo never within one second; exit 1`)
	if b, _ := os.ReadFile(filepath.Join(co, "conf.txt")); string(b) != "version=2\n" {
		t.Fatalf("conf.txt in the checkout: %q", b)
	}
	time.Sleep(1200 * time.Millisecond) // the fetch comes later: a second later is enough
	got, err := f.Fetch(t.Context(), "racy", "", false)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	// git itself, in the agent's checkout, sees the edit (read only: a
	// status that rewrote the index would mark the entry for good).
	if st := gittest.Git(t, co, "--no-optional-locks", "status", "--porcelain"); !strings.Contains(st, "M conf.txt") {
		t.Fatalf("git status in the checkout: %q", st)
	}
	if c := gittest.Git(t, repo, "show", got.Branch+":conf.txt"); c != "version=2" {
		t.Fatalf("the agent's conf.txt holds version=2, but %s (tip %.12s, %d commits) holds %q: its last edit was dropped", got.Branch, got.Tip, got.Commits, c)
	}
}

// shoal/<id>.
func TestWithChangesLeavesOutWhatThePersonsGitIgnores(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".config", "git"), 0o700)
	os.WriteFile(filepath.Join(home, ".config", "git", "ignore"), []byte(".env\n"), 0o600)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	os.WriteFile(filepath.Join(repo, ".env"), []byte("API_KEY=sk-secret\n"), 0o600)
	os.WriteFile(filepath.Join(repo, "todo.txt"), []byte("mine\n"), 0o644)
	// The person's own git, with their configuration, ignores it.
	cmd := exec.Command("git", "status", "--porcelain")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1")
	if st, _ := cmd.Output(); strings.Contains(string(st), ".env") || !strings.Contains(string(st), "todo.txt") {
		t.Fatalf("the person's git status: %q", st)
	}

	co := openOnRepo(t, f, "genv", repo, true)
	if _, err := os.Stat(filepath.Join(co, "todo.txt")); err != nil {
		t.Fatalf("the untracked todo.txt did not reach the agent: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(co, ".env")); err == nil {
		t.Fatalf("a file the person's git ignores was sent to node a, into the agent's checkout: .env = %q", b)
	}
}

// A node killed while it made an agent's checkout leaves the checkout's
// directory without the record of what it was opened on (written last).
// Once the node was back, the retry of the same open (the same id) was
// refused for good, "checkout ... already exists". The half-made
// checkout is taken for what it is and made again.
func TestOpenRetriedOverAHalfMadeCheckout(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	first := openOnRepo(t, f, "first", repo, false)
	// What a crash in the middle of making agent mid's checkout leaves.
	half := filepath.Join(filepath.Dir(first), "mid")
	if err := os.MkdirAll(filepath.Join(half, ".git", "objects"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(half, "partial.bin"), []byte("half written"), 0o600)
	if co := openOnRepo(t, f, "mid", repo, true); co != half {
		t.Fatalf("agent mid's checkout is %s, want %s", co, half)
	}
	if _, err := os.Stat(filepath.Join(half, "partial.bin")); err == nil {
		t.Error("what the crash left is still in agent mid's checkout")
	}
	if b, err := os.ReadFile(filepath.Join(half, "a.txt")); err != nil || string(b) != "a\n" {
		t.Errorf("agent mid's checkout holds a.txt %q (%v)", b, err)
	}
}

// A branch being rebased (or bisected) is checked out as git counts it:
// git branch -f refuses to move it ("used by worktree"). While the person
// rebased shoal/<id> (stopped to edit a commit), shoal fetch moved it all
// the same; the rebase, when it ended, could not set the branch ("cannot
// lock ref … but expected …") and left the person's rebased commits on a
// detached HEAD. The fetch is refused, saying why.
func TestFetchDoesNotMoveABranchBeingRebased(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "rebased", repo, false)
	agentShell(t, co, "echo agent > b.txt && git add b.txt && git commit -qm 'agent work'")
	if _, err := f.Fetch(t.Context(), "rebased", "", false); err != nil {
		t.Fatal(err)
	}
	// The person rebases the agent's branch onto main, which moved on,
	// stopping at its commit to edit it.
	os.WriteFile(filepath.Join(repo, "c.txt"), []byte("mine\n"), 0o644)
	gittest.Git(t, repo, "add", "c.txt")
	gittest.Git(t, repo, "commit", "-qm", "main moves on")
	gittest.Git(t, repo, "switch", "-q", "shoal/rebased")
	git := personsRebase(repo, "sed -i s/^pick/edit/")
	if out, err := git("rebase", "-q", "-i", "main"); err != nil {
		t.Fatalf("git rebase -i: %v\n%s", err, out)
	}
	before := gittest.Git(t, repo, "rev-parse", "refs/heads/shoal/rebased")
	// git itself will not move it now.
	if out, err := git("branch", "-f", "shoal/rebased", "main"); err == nil {
		t.Fatalf("git branch -f moved a branch being rebased: %s", out)
	}

	os.WriteFile(filepath.Join(co, "more.txt"), []byte("more\n"), 0o644)
	_, err := f.Fetch(t.Context(), "rebased", "", false)
	if after := gittest.Git(t, repo, "rev-parse", "refs/heads/shoal/rebased"); after != before {
		out, cerr := git("rebase", "--continue")
		t.Fatalf("shoal fetch (%v) moved shoal/rebased from %.12s to %.12s while the person rebased it; git rebase --continue then: %v\n%s", err, before, after, cerr, out)
	}
	if err == nil || !strings.Contains(err.Error(), "branch shoal/rebased is being rebased") {
		t.Errorf("the fetch onto a branch being rebased: %v, want it refused saying so", err)
	}
}

// An agent that makes a git repository of its own in its checkout (git
// init for a tool, a sample project, a test fixture) and commits there
// got back, on shoal/<id>, a link to a commit that exists only on the
// node, and nothing said its files did not come back; one not yet
// committed to failed every diff and fetch of the agent's work. Such a
// repository is left out of what comes back, and the commit says so; the
// rest of the work comes back.
func TestFetchLeavesOutANestedRepositoryAndSaysSo(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "nested", repo, false)
	agentShell(t, co, "echo work > work.txt && git init -q scratch && mkdir tool && cd tool && git init -q && echo 'package tool' > tool.go && git add . && git -c user.name=agent -c user.email=agent@example.invalid commit -qm tool")

	if _, err := f.Diff(t.Context(), "nested", true); err != nil {
		t.Errorf("diff: %v", err)
	}
	got, err := f.Fetch(t.Context(), "nested", "", false)
	if err != nil {
		t.Fatalf("fetch of an agent that wrote work.txt: %v", err)
	}
	if w := gittest.Git(t, repo, "show", got.Branch+":work.txt"); w != "work" {
		t.Errorf("work.txt on %s: %q", got.Branch, w)
	}
	if tree := gittest.Git(t, repo, "ls-tree", "-r", got.Branch); strings.Contains(tree, "160000") || strings.Contains(tree, "tool") || strings.Contains(tree, "scratch") {
		t.Errorf("%s holds what it cannot bring back:\n%s", got.Branch, tree)
	}
	if msg := gittest.Git(t, repo, "log", "-1", "--format=%B", got.Branch); !strings.Contains(msg, "  scratch/\n") || !strings.Contains(msg, "  tool/") {
		t.Errorf("the commit of the agent's work does not name what it left out:\n%s", msg)
	}
}

// A repository whose path is not valid UTF-8 (a Latin-1 name) was opened
// on, but the agent's record, JSON, kept its path with the byte replaced:
// the fetch that ends a job, or shoal fetch without --into, then looked
// for a path that does not exist (or another repository of that name).
// The open is refused, saying why.
func TestOpenRefusesARepositoryWhosePathIsNotUTF8(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	latin1 := filepath.Join(t.TempDir(), "caf\xe9")
	os.MkdirAll(latin1, 0o755)
	gittest.Git(t, latin1, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(latin1, "a.txt"), []byte("a\n"), 0o644)
	gittest.Git(t, latin1, "add", ".")
	gittest.Git(t, latin1, "commit", "-q", "-m", "first")
	_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "latin"}, client.RepoSource{Dir: latin1})
	if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "is not valid UTF-8") {
		t.Fatalf("an open on %q: %v, want it refused as not UTF-8", latin1, err)
	}
	if _, err := f.Record(t.Context(), "latin"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("the refused open left a record: %v", err)
	}
}

// On the node, a submodule of the caller's repository is an empty
// directory (never checked out there), which the agent sees and may
// write into: what it wrote there was neither in its diff nor in its
// fetched work, and nothing said so (git add --all passes over a
// directory its index names as a link). It cannot come back with this
// repository's commit; the commit says what was left out.
func TestWorkWrittenIntoASubmoduleDirectoryIsNamed(t *testing.T) {
	t.Parallel()
	f, repo, _, checkout := submoduleRepo(t, "subwrite")
	if ents, err := os.ReadDir(filepath.Join(checkout, "sub")); err != nil || len(ents) != 0 {
		t.Fatalf("the submodule's directory in the agent's checkout: %v %v", ents, err)
	}
	os.WriteFile(filepath.Join(checkout, "sub", "fix.txt"), []byte("the agent's fix\n"), 0o644)
	os.WriteFile(filepath.Join(checkout, "app.txt"), []byte("app 2\n"), 0o644)
	got, err := f.Fetch(t.Context(), "subwrite", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if app := gittest.Git(t, repo, "show", got.Branch+":app.txt"); app != "app 2" {
		t.Errorf("app.txt on %s: %q", got.Branch, app)
	}
	if msg := gittest.Git(t, repo, "log", "-1", "--format=%B", got.Branch); !strings.Contains(msg, "submodule's directory") || !strings.Contains(msg, "  sub/") {
		t.Errorf("the agent wrote sub/fix.txt, which cannot come back; the commit of its work does not say so:\n%s", msg)
	}
}

// A second --with-changes open of the same work on the same base (a job
// retried, a second agent on it) sent the repository's whole history
// again: the commit of the uncommitted work was made anew each time,
// dated now, so its bundle was another. It is dated as its base, the
// same commit each time, and its bundle is not sent again. (Other work on
// the same base still sends the history: the node keeps what comes with
// a caller's uncommitted work in the agent's checkout, not its cache.)
func TestWithChangesSendsOnlyWhatTheNodeLacks(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a")
	repo := gittest.Repo(t, "a.txt", "a\n")
	for i := range 30 {
		os.WriteFile(filepath.Join(repo, "a.txt"), []byte(strings.Repeat("history\n", i+1)), 0o644)
		gittest.Git(t, repo, "commit", "-qam", "more history")
	}
	os.WriteFile(filepath.Join(repo, "wip.txt"), []byte("work in progress\n"), 0o644)
	openOnRepo(t, f, "first", repo, true)
	time.Sleep(1100 * time.Millisecond) // the second open comes a moment later
	*said = nil
	openOnRepo(t, f, "second", repo, true)
	for _, l := range *said {
		if strings.HasPrefix(l, "sent ") && !strings.HasPrefix(l, "sent 1 commit of") {
			t.Fatalf("node a was sent the whole history (31 commits and the work) for the first agent; for the second, with no new commit, it was sent: %q", *said)
		}
	}
}

// A branch a rebase --update-refs will set when it ends is in use as git
// counts it (git branch -f refuses it: "checked out at"). The person's
// branch feature stacks on the agent's shoal/<id>; they rebase feature
// onto main with --update-refs (or rebase.updateRefs = true), stopping
// to edit. A fetch of more of the agent's work moves shoal/<id> meanwhile;
// the rebase then cannot end: each git rebase --continue fails, "cannot
// lock ref 'refs/heads/shoal/…': is at … but expected …".
func TestFetchDoesNotMoveABranchARebaseWillUpdate(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "stacked", repo, false)
	agentShell(t, co, "echo agent > b.txt && git add b.txt && git commit -qm 'agent work'")
	if _, err := f.Fetch(t.Context(), "stacked", "", false); err != nil {
		t.Fatal(err)
	}
	gittest.Git(t, repo, "switch", "-q", "-c", "feature", "shoal/stacked")
	os.WriteFile(filepath.Join(repo, "mine.txt"), []byte("mine\n"), 0o644)
	gittest.Git(t, repo, "add", "mine.txt")
	gittest.Git(t, repo, "commit", "-qm", "mine, on the agent's")
	gittest.Git(t, repo, "switch", "-q", "main")
	os.WriteFile(filepath.Join(repo, "c.txt"), []byte("main\n"), 0o644)
	gittest.Git(t, repo, "add", "c.txt")
	gittest.Git(t, repo, "commit", "-qm", "main moves on")
	gittest.Git(t, repo, "switch", "-q", "feature")
	git := personsRebase(repo, "sed -i 1s/^pick/edit/")
	if out, err := git("rebase", "-q", "-i", "--update-refs", "main"); err != nil {
		t.Fatalf("git rebase -i --update-refs: %v\n%s", err, out)
	}
	before := gittest.Git(t, repo, "rev-parse", "refs/heads/shoal/stacked")
	if out, err := git("branch", "-f", "shoal/stacked", "main"); err == nil {
		t.Fatalf("git branch -f moved a branch the rebase will update: %s", out)
	}

	os.WriteFile(filepath.Join(co, "more.txt"), []byte("more\n"), 0o644)
	_, err := f.Fetch(t.Context(), "stacked", "", false)
	if after := gittest.Git(t, repo, "rev-parse", "refs/heads/shoal/stacked"); after != before {
		out, cerr := git("rebase", "--continue")
		t.Fatalf("shoal fetch (%v) moved shoal/stacked from %.12s to %.12s while a rebase --update-refs was to set it; git rebase --continue then: %v\n%s", err, before, after, cerr, out)
	}
	if err == nil {
		t.Errorf("the fetch onto a branch a rebase will update: no error")
	}
}

// The commit of the caller's uncommitted work is Shoal's, but authored
// shoal@localhost, not @shoal.invalid: once shoal/<id> held it (a fetch
// before the agent committed), an agent that amended it into a commit of
// its own ("Finish the work in progress") cannot be fetched: the fetch is
// refused as moving past a commit "not made by Shoal", naming Shoal's.
func TestFetchAfterTheAgentAmendedTheCommitOfTheCallersWork(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	os.WriteFile(filepath.Join(repo, "wip.txt"), []byte("wip\n"), 0o644)
	co := openOnRepo(t, f, "amend", repo, true)
	if _, err := f.Fetch(t.Context(), "amend", "", false); err != nil {
		t.Fatal(err)
	}
	agentShell(t, co, "echo done >> wip.txt && git commit -qa --amend -m 'Finish the work in progress'")
	if _, err := f.Fetch(t.Context(), "amend", "", false); err != nil {
		t.Errorf("the fetch after the agent amended the commit of the caller's work: %v", err)
	}
}

// Two agents opened --with-changes on the same work start on the same
// commit (1e0a5f9 dates it as its base); neither changed anything, so
// their work is that commit. Fetched at once (two jobs ending together),
// both land through refs/shoal-incoming/<tip>, the same ref: one's
// deferred delete takes it from under the other, which fails with "the
// bundle's commit is , not the agent's …".
func TestTwoAgentsOnTheSameWorkFetchedAtOnce(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	os.WriteFile(filepath.Join(repo, "wip.txt"), []byte("wip\n"), 0o644)
	ids := []string{"same1", "same2", "same3"}
	for _, id := range ids {
		openOnRepo(t, f, id, repo, true)
	}
	for round := range 5 {
		errs := make(chan error, len(ids))
		for _, id := range ids {
			go func() { _, err := f.Fetch(t.Context(), id, "", false); errs <- err }()
		}
		for range ids {
			if err := <-errs; err != nil {
				t.Fatalf("round %d, fetches at once: %v", round, err)
			}
		}
	}
}

// A shallow clone (git clone --depth, as CI and big repositories make
// them) is taken as a repository whose first commit is its shallow
// boundary, and the open fails as an internal error with git's words:
// "git rev-list: error: Could not read …  fatal: Failed to traverse
// parents of commit …". It should be refused as a wrong request, saying
// it is shallow and what to do (git fetch --unshallow).
func TestOpenOnAShallowCloneSaysWhy(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	origin := gittest.Repo(t, "a.txt", "a\n")
	for i := range 3 {
		os.WriteFile(filepath.Join(origin, "a.txt"), []byte(strings.Repeat("a\n", i+2)), 0o644)
		gittest.Git(t, origin, "commit", "-qam", "more")
	}
	clone := filepath.Join(t.TempDir(), "clone")
	gittest.Git(t, origin, "clone", "-q", "--depth=1", "file://"+origin, clone)
	_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "shallow"}, client.RepoSource{Dir: clone})
	if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "shallow") {
		t.Errorf("an open on a shallow clone: %v (code %v), want it refused as one", err, schemas.CodeOf(err))
	}
}

// A partial clone (git clone --filter=blob:none, which hosts recommend
// for big repositories) lacks the blobs of its history, which git cannot
// bundle: the open failed with git's words ("fatal: unable to read …
// error: pack-objects died"), as an internal error. It is refused as a
// wrong request, saying it is partial and what to do.
func TestOpenOnAPartialCloneSaysWhy(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	origin := gittest.Repo(t, "a.txt", "a\n")
	gittest.Git(t, origin, "config", "uploadpack.allowFilter", "true")
	for i := range 3 {
		os.WriteFile(filepath.Join(origin, "a.txt"), []byte(strings.Repeat("a\n", i+2)), 0o644)
		gittest.Git(t, origin, "commit", "-qam", "more")
	}
	clone := filepath.Join(t.TempDir(), "clone")
	gittest.Git(t, origin, "clone", "-q", "--filter=blob:none", "file://"+origin, clone)
	_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "partial"}, client.RepoSource{Dir: clone})
	if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "partial clone") {
		t.Fatalf("an open on a partial clone: %v (code %v), want it refused as one", err, schemas.CodeOf(err))
	}
	// What it says to do makes the clone whole, and the open goes.
	gittest.Git(t, clone, "config", "--unset", "remote.origin.partialclonefilter")
	gittest.Git(t, clone, "fetch", "-q", "--refetch", "origin")
	gittest.Git(t, clone, "config", "--unset", "remote.origin.promisor")
	if !strings.Contains(err.Error(), "git config --unset remote.origin.partialclonefilter && git fetch --refetch origin && git config --unset remote.origin.promisor") {
		t.Errorf("the refusal does not say how to make the clone whole: %v", err)
	}
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "partial"}, client.RepoSource{Dir: clone}); err != nil {
		t.Errorf("an open on the clone made whole: %v", err)
	}
}

// An untracked file the person forgot (a core dump, a data set) makes a
// --with-changes open too large; the refusal speaks of commits the node
// lacks and says to open on a directory of the node, not that the bulk is
// the uncommitted work, nor which file. It names the largest files.
func TestWithChangesPastTheLimitSaysItIsTheUncommittedWork(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	small, err := client.NewDirect(natstest.Connect(t, srv), client.Config{MaxBundle: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	repo := gittest.Repo(t, "a.txt", "a\n")
	noise := make([]byte, 4<<20)
	rand.Read(noise)
	os.WriteFile(filepath.Join(repo, "core.dump"), noise, 0o644)
	_, err = small.OpenRepo(t.Context(), schemas.OpenRequest{ID: "big"}, client.RepoSource{Dir: repo, WithChanges: true})
	if err == nil || !strings.Contains(err.Error(), "uncommitted") || !strings.Contains(err.Error(), "core.dump (4.0 MiB)") {
		t.Errorf("a --with-changes open past the limit because of an untracked 4 MiB file: %v", err)
	}
}

// A submodule's directory is empty on the node, and e82e32a names what
// an agent writes into it. An agent that populates it first, as agents do
// (git submodule update --init: its URL answers from the node), and then
// edits a file in it: the edit is in neither shoal/<id> nor its commit's
// message, with no word of it.
func TestWorkInASubmoduleTheAgentCheckedOutIsNamed(t *testing.T) {
	t.Parallel()
	f, repo, _, checkout := submoduleRepo(t, "subinit")
	agentShell(t, checkout, "git -c protocol.file.allow=always submodule --quiet update --init && echo 'the agent fixed it' > sub/lib.txt && echo 'app 2' > app.txt")
	got, err := f.Fetch(t.Context(), "subinit", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if msg := gittest.Git(t, repo, "log", "-1", "--format=%B", got.Branch); !strings.Contains(msg, "  sub/") {
		t.Errorf("the agent edited sub/lib.txt, which does not come back; the commit of its work does not say so:\n%s", msg)
	}
}

// personsRebase runs the person's git in repo, as a rebase they run
// needs it: their name, no configuration of the machine's, and editor as
// the editor of the rebase's steps.
func personsRebase(repo, editor string) func(args ...string) ([]byte, error) {
	return func(args ...string) ([]byte, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_SEQUENCE_EDITOR="+editor,
			"GIT_AUTHOR_NAME=me", "GIT_AUTHOR_EMAIL=me@example.invalid", "GIT_COMMITTER_NAME=me", "GIT_COMMITTER_EMAIL=me@example.invalid")
		return cmd.CombinedOutput()
	}
}

// A fetch --into a repository that lacks the commit the agent started
// on (another repository, a clone behind) printed git's "Repository
// lacks these prerequisite commits"; it names the commit and what to do.
func TestFetchIntoARepositoryWithoutTheBaseNamesIt(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	base := gittest.Git(t, repo, "rev-parse", "HEAD")
	co := openOnRepo(t, f, "behind", repo, false)
	agentShell(t, co, "echo work > work.txt && git add work.txt && git -c user.name=a -c user.email=a@a commit -qm work")
	other := gittest.Repo(t, "b.txt", "unrelated\n")
	_, err := f.Fetch(t.Context(), "behind", other, false)
	if err == nil || strings.Contains(err.Error(), "prerequisite") || !strings.Contains(err.Error(), base[:12]) || !strings.Contains(err.Error(), "git fetch") {
		t.Errorf("a fetch into a repository without the agent's base %s: %v", base[:12], err)
	}
	if out := gittest.Git(t, other, "branch", "--list", "shoal/*"); out != "" {
		t.Errorf("the fetch that failed left a branch: %s", out)
	}
}

// A fetch moved shoal/<id> back, dropping the agent's commits fetched
// before, and said "0 commits": the agent had reset its history (or its
// checkout was lost and a reopen began anew). It is refused now, naming
// them, and moves only when forced.
func TestFetchKeepsTheAgentsCommitsFetchedBeforeUnlessForced(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "rewound", repo, false)
	agentShell(t, co, "echo work > w.txt && git add w.txt && git commit -qm 'the agent work'")
	first, err := f.Fetch(t.Context(), "rewound", "", false)
	if err != nil || first.Commits != 1 {
		t.Fatalf("the first fetch: %+v %v", first, err)
	}
	agentShell(t, co, "git reset -q --hard HEAD~1")
	_, err = f.Fetch(t.Context(), "rewound", "", false)
	if err == nil || !strings.Contains(err.Error(), "the agent work") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a fetch leaving the agent's commit fetched before: %v; want a refusal naming it", err)
	}
	if got := gittest.Git(t, repo, "rev-parse", "shoal/rewound"); got != first.Tip {
		t.Fatalf("shoal/rewound moved to %s, from the work fetched before (%s)", got, first.Tip)
	}
	forced, err := f.Fetch(t.Context(), "rewound", "", true)
	if err != nil {
		t.Fatalf("the forced fetch: %v", err)
	}
	if got := gittest.Git(t, repo, "rev-parse", "shoal/rewound"); got != forced.Tip || forced.Tip == first.Tip {
		t.Fatalf("after the forced fetch shoal/rewound is at %s (the fetch said %s, the first %s)", got, forced.Tip, first.Tip)
	}
}

// An agent that leaves its work uncommitted (the usual case) has it
// fetched as its node's commit of it. Once its checkout was lost and a
// reopen began anew, or once it undid its changes, the next fetch moved
// shoal/<id> back to the base, saying "0 commits, 0 files changed": that
// commit was left behind as each fetch's commit of the uncommitted work
// is, whatever the agent's work held then. Such a fetch is refused now,
// naming the files, and moves only when forced; a fetch whose work holds
// those changes still (committed by the agent, or changed further)
// leaves the earlier commit behind as before.
func TestFetchKeepsUncommittedWorkFetchedBeforeUnlessForced(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	fetch := func(id string, force bool) (schemas.FetchReply, error) {
		t.Helper()
		return f.Fetch(t.Context(), id, "", force)
	}
	at := func(id string) string { t.Helper(); return gittest.Git(t, repo, "rev-parse", "shoal/"+id) }

	// Its checkout lost, and a reopen begun anew.
	co := openOnRepo(t, f, "lost", repo, false)
	agentShell(t, co, "echo precious > work.txt")
	first, err := fetch("lost", false)
	if err != nil || first.Files != 1 {
		t.Fatalf("the first fetch: %+v %v", first, err)
	}
	if _, err := f.Close(t.Context(), schemas.AgentRequest{AgentID: "lost"}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(co); err != nil {
		t.Fatal(err)
	}
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "lost"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatalf("the reopen: %v", err)
	}
	_, err = fetch("lost", false)
	if err == nil || !strings.Contains(err.Error(), `"work.txt"`) || !strings.Contains(err.Error(), first.Tip[:12]) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a fetch of work begun anew: %v; want a refusal naming work.txt, %.12s and --force", err, first.Tip)
	}
	if got := at("lost"); got != first.Tip {
		t.Fatalf("shoal/lost moved to %s, from the work fetched before (%s)", got, first.Tip)
	}
	forced, err := fetch("lost", true)
	if err != nil {
		t.Fatalf("the forced fetch: %v", err)
	}
	if got := at("lost"); got != forced.Tip || got == first.Tip {
		t.Fatalf("after the forced fetch shoal/lost is at %s (the fetch said %s, the first %s)", got, forced.Tip, first.Tip)
	}
	if got := gittest.Git(t, repo, "reflog", "-1", "--format=%gs", "shoal/lost"); !strings.Contains(got, "leaving its uncommitted work fetched before") {
		t.Errorf("the branch's reflog says %q of the forced move", got)
	}

	// Its changes undone in its own checkout, one of two files kept.
	co = openOnRepo(t, f, "undone", repo, false)
	agentShell(t, co, "echo one > one.txt && echo two > two.txt && echo changed > a.txt")
	first, err = fetch("undone", false)
	if err != nil || first.Files != 3 {
		t.Fatalf("the first fetch: %+v %v", first, err)
	}
	agentShell(t, co, "git checkout -q -- a.txt && rm one.txt")
	_, err = fetch("undone", false)
	if err == nil || !strings.Contains(err.Error(), `"a.txt", "one.txt"`) || strings.Contains(err.Error(), "two.txt") {
		t.Fatalf("a fetch of work with changes undone: %v; want a refusal naming a.txt and one.txt alone", err)
	}
	if got := at("undone"); got != first.Tip {
		t.Fatalf("shoal/undone moved to %s, from the work fetched before (%s)", got, first.Tip)
	}

	// Its work committed by the agent, then changed further: each fetch
	// moves on.
	co = openOnRepo(t, f, "kept", repo, false)
	agentShell(t, co, "echo draft > work.txt")
	if _, err := fetch("kept", false); err != nil {
		t.Fatalf("the first fetch: %v", err)
	}
	agentShell(t, co, "git add work.txt && git commit -qm 'the work' && echo more > more.txt")
	second, err := fetch("kept", false)
	if err != nil || at("kept") != second.Tip {
		t.Fatalf("a fetch of the work the agent committed since: %+v %v", second, err)
	}
	agentShell(t, co, "echo final > more.txt")
	third, err := fetch("kept", false)
	if err != nil || at("kept") != third.Tip {
		t.Fatalf("a fetch of the work the agent changed further since: %+v %v", third, err)
	}
}

// A fetch and a diff say how many files the agent changed: they counted
// the words git listed, so one file named "my notes v2.txt" was three.
func TestFilesChangedCountsANameWithSpacesOnce(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "spaced", repo, false)
	agentShell(t, co, `echo x > 'my notes v2.txt' && echo y > 'a;b $(x).txt' && echo z > 'ü ñ.txt'`)
	diff, err := f.Diff(t.Context(), "spaced", true)
	if err != nil || diff.Files != 3 {
		t.Errorf("the diff says %d files changed (%v); the agent changed 3", diff.Files, err)
	}
	got, err := f.Fetch(t.Context(), "spaced", "", false)
	if err != nil || got.Files != 3 {
		t.Errorf("the fetch says %d files changed (%v); the agent changed 3", got.Files, err)
	}
}

// An open on a large repository said nothing while git built the bundle
// (40 s for 115 MiB of loose objects), then "sent … in 903ms": the wait
// looked like a hang. The bundling is said as it begins and when it
// ends, with its size and time, before the sending.
func TestOpenSaysItBundlesBeforeItSends(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a")
	repo := gittest.Repo(t, "a.txt", "a\n")
	openOnRepo(t, f, "told", repo, false)
	want := []string{"bundling what node a lacks of " + repo, "bundled 1 commit of " + repo + ": ", "sending 1 commit of " + repo, "sent 1 commit of " + repo}
	next := 0
	for _, l := range *said {
		if next < len(want) && strings.HasPrefix(l, want[next]) {
			next++
		}
	}
	if next < len(want) {
		t.Errorf("the open said %q; want lines beginning %q, in order", *said, want)
	}
}

// Reopening a live agent's id on another node asked its node for its
// work, stored the bundle and said "carried agent …'s work", and only
// then was refused as an id in use. It is refused before anything moves.
func TestReopenOfALiveAgentElsewhereIsRefusedBeforeItsWorkMoves(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a", "b")
	repo := gittest.Repo(t, "a.txt", "a\n")
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "busy", Node: "a"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	*said = nil
	_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "busy", Node: "b"}, client.RepoSource{Dir: repo})
	if schemas.CodeOf(err) != schemas.CodeConflict || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("a reopen of a live agent on another node: %v; want it refused as in use", err)
	}
	for _, l := range *said {
		if strings.Contains(l, "carried") || strings.Contains(l, "sending") {
			t.Errorf("before the refusal the open said %q", l)
		}
	}
}

// Reopened while the node holding its work was down, an agent was tried
// on every other node in turn, each failing with the same words about
// the node that was down ("no node can take this agent: <it>; <it>;
// <it>"): no other node could have done better. The open fails at once,
// saying where the work is.
func TestReopenWhileItsWorkIsOnANodeDownFailsOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	a, err := node.New(node.Config{Name: "a", Dir: t.TempDir(), Conn: natstest.Connect(t, srv), Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stopA := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	defer func() { stopA(); <-ran }()
	<-a.Ready()
	for _, name := range []string{"b", "c"} {
		fabrictest.Node(t, srv, node.Config{Name: name, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	}
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	repo := gittest.Repo(t, "a.txt", "a\n")
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "away", Node: "a"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Close(t.Context(), schemas.AgentRequest{AgentID: "away"}); err != nil {
		t.Fatal(err)
	}
	stopA()
	if err := <-ran; err != nil {
		t.Fatalf("node a stopping: %v", err)
	}
	ran <- nil // for the deferred stop
	_, err = f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "away"}, client.RepoSource{Dir: repo})
	if err == nil || !strings.Contains(err.Error(), "agent away's work is on node a, which could not send it") ||
		strings.Count(err.Error(), "could not send it") != 1 {
		t.Fatalf("a reopen while the node with its work is down: %v; want one error saying where the work is", err)
	}
}

// Right after a node restarted, a send to one of its last run's agents
// whose record still named it live was answered "no such agent" (exit 3,
// which a script takes for an id that is gone), and a moment later "is
// dead". A node that runs no agent its record names is away for it: the
// record is read again, and while it still names the node live the
// request is unavailable, not unknown.
func TestANodeThatRunsNoAgentItsRecordNamesIsAwayForIt(t *testing.T) {
	t.Parallel()
	f, kv := nodeAndRecords(t)
	now := float64(time.Now().Unix())
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "left", Node: "a", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now})
	if _, err := kv.Put(t.Context(), "left", rec); err != nil {
		t.Fatal(err)
	}
	_, err := f.Send(t.Context(), schemas.SendRequest{AgentID: "left", Text: "hello"})
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "node a runs no agent left though its record names it") {
		t.Fatalf("a send to an agent its record says node a runs, which node a does not: %v", err)
	}
}

// A fetch whose repository moved since the open says so and how to fetch
// all the same (--into), rather than git's "not in a git work tree: no
// such file or directory" (a pool user's review); given --into its new
// place, the work lands there.
func TestFetchFromAMovedRepositoryNamesInto(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	openOnRepo(t, f, "mover", repo, false)
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(repo, moved); err != nil {
		t.Fatal(err)
	}
	_, err := f.Fetch(t.Context(), "mover", "", false)
	if err == nil || !strings.Contains(err.Error(), "is not there any more") || !strings.Contains(err.Error(), "--into") {
		t.Fatalf("a fetch whose repository moved: %v", err)
	}
	if _, err := f.Fetch(t.Context(), "mover", moved, false); err != nil {
		t.Fatalf("the fetch --into its new place: %v", err)
	}
}

// An open's claim that its node never took up, its caller gone before the
// node heard of it (a client killed as it opened), long past any open:
// `shoal ls` showed it starting for good, a send said to try again in a
// moment, and a close said there was no such agent. A close now ends the
// claim, and a send says the agent never started.
func TestAClaimNoNodeTookUpIsClosed(t *testing.T) {
	t.Parallel()
	f, kv := nodeAndRecords(t)
	then := float64(time.Now().Add(-schemas.OpenTimeout - 2*time.Minute).Unix())
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "never", Node: "a", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: then, LastActivity: then, RequestID: "r1"})
	if _, err := kv.Put(t.Context(), "never", rec); err != nil {
		t.Fatal(err)
	}
	_, err := f.Send(t.Context(), schemas.SendRequest{AgentID: "never", Text: "hello"})
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "never started") {
		t.Errorf("a send to a claim no node took up: %v", err)
	}
	rep, err := f.Close(t.Context(), schemas.AgentRequest{AgentID: "never"})
	if err != nil || !rep.Closed {
		t.Fatalf("closing a claim no node took up: %+v %v", rep, err)
	}
	if rec, err := f.Record(t.Context(), "never"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("the claim after its close: %+v %v", rec, err)
	}
}

// nodeAndRecords starts node "a" of a fake backend on a fabric of its own
// and returns a client of it and the agents' records, to write a record
// the node does not know of.
func nodeAndRecords(t *testing.T) (*client.Direct, jetstream.KeyValue) {
	t.Helper()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := f.JetStream().KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	return f, kv
}

// An agent on a repository names its branch from its claim, while it
// starts: `shoal ls` showed an empty branch ("( from 9e5616381665)")
// until its node's record replaced the claim.
func TestAStartingAgentOnARepositoryNamesItsBranch(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{StartDelay: 5 * time.Second})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	repo := gittest.Repo(t, "a.txt", "a\n")
	opened := make(chan error, 1)
	go func() {
		_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "early"}, client.RepoSource{Dir: repo})
		opened <- err
	}()
	var rec schemas.AgentRecord
	deadline := time.Now().Add(30 * time.Second)
	for rec.Workspace == nil {
		if time.Now().After(deadline) {
			t.Fatal("no record of the agent on a repository in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
		rec, _ = f.Record(t.Context(), "early")
	}
	if rec.Status != schemas.StatusStarting {
		t.Fatalf("the record was first seen %s, not starting: the start was not slow enough to look at", rec.Status)
	}
	if rec.Workspace.Branch != schemas.BranchName("early") {
		t.Errorf("the record of an agent still starting names branch %q, want %q", rec.Workspace.Branch, schemas.BranchName("early"))
	}
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
}

// A reopened agent goes on in its own checkout: a reopen that asks for
// the caller's uncommitted work or another ref took neither, saying
// nothing (it committed the caller's uncommitted work first, hundreds of
// MiB for an outside reviewer, and dropped it). It is refused, before
// anything is prepared, naming what to leave out.
func TestReopenWithChangesOrARefIsRefused(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a")
	repo := gittest.Repo(t, "a.txt", "a\n")
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "again", Node: "a"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Close(t.Context(), schemas.AgentRequest{AgentID: "again"}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(repo, "mine.txt"), []byte("mine\n"), 0o644)
	*said = nil
	for _, src := range []client.RepoSource{{Dir: repo, WithChanges: true}, {Dir: repo, Ref: "main"}} {
		_, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "again", Node: "a"}, src)
		if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "agent again goes on in its own checkout") {
			t.Errorf("a reopen with %+v: %v; want it refused", src, err)
		}
	}
	for _, l := range *said {
		if strings.Contains(l, "bundling") || strings.Contains(l, "carried") {
			t.Errorf("before the refusal the open said %q", l)
		}
	}
	// Without them it goes on.
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "again", Node: "a"}, client.RepoSource{Dir: repo}); err != nil {
		t.Errorf("the reopen: %v", err)
	}
}

// An agent that removed its checkout's .git (rm -rf .git, a git init
// gone wrong) left diff and fetch saying git's "fatal: not a git
// repository", as an internal error, which named neither the agent's
// doing nor where its files are. Both say so, as a checkout lost.
func TestDiffOfACheckoutWhoseGitIsGoneSaysSo(t *testing.T) {
	t.Parallel()
	f := oneNodeFabric(t)
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "nogit", repo, false)
	agentShell(t, co, "echo mine > k.txt && rm -rf .git")
	_, err := f.Diff(t.Context(), "nogit", false)
	if schemas.CodeOf(err) != schemas.CodeNotFound || !strings.Contains(err.Error(), "has no .git any more") || !strings.Contains(err.Error(), co) {
		t.Errorf("the diff of a checkout whose .git is gone: %v (code %v)", err, schemas.CodeOf(err))
	}
	_, err = f.Fetch(t.Context(), "nogit", "", false)
	if !strings.Contains(fmt.Sprint(err), "has no .git any more") {
		t.Errorf("the fetch of a checkout whose .git is gone: %v", err)
	}
}

// The commit an agent started on, gone from the caller's repository (the
// person amended it and pruned, or fetches --into a clone that never had
// it): the fetch was refused, saying to git fetch it, which nothing
// could, though the node has it. The node sends the work's whole history
// then, and it lands.
func TestFetchIntoARepositoryLackingTheStart(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a")
	repo := gittest.Repo(t, "a.txt", "a\n")
	co := openOnRepo(t, f, "pruned", repo, false)
	agentShell(t, co, "echo work > work.txt && git add work.txt && git -c user.name=a -c user.email=a@b commit -qm work")
	gittest.Git(t, repo, "commit", "-q", "--amend", "-m", "amended")
	gittest.Git(t, repo, "reflog", "expire", "--expire=now", "--all")
	gittest.Git(t, repo, "gc", "-q", "--prune=now")
	got, err := f.Fetch(t.Context(), "pruned", "", false)
	if err != nil {
		t.Fatalf("a fetch into the repository whose start was pruned: %v", err)
	}
	if w := gittest.Git(t, repo, "show", got.Branch+":work.txt"); w != "work" {
		t.Errorf("%s holds work.txt %q", got.Branch, w)
	}
	if !slices.ContainsFunc(*said, func(l string) bool { return strings.Contains(l, "lacks the commit agent pruned started on") }) {
		t.Errorf("the fetch did not say it asked for the whole history: %q", *said)
	}
}

// A fetch while the agent works takes its work so far, and said nothing
// of the turn still under way (outside review): it says so.
func TestFetchDuringATurnSaysItIsWorkSoFar(t *testing.T) {
	t.Parallel()
	f, said := tellingFabric(t, "a")
	repo := gittest.Repo(t, "a.txt", "a\n")
	openOnRepo(t, f, "busy", repo, false)
	if _, err := f.Send(t.Context(), schemas.SendRequest{AgentID: "busy", Text: "slow" + strings.Repeat(" word", 100)}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the agent works", func() bool {
		rec, err := f.Record(t.Context(), "busy")
		return err == nil && rec.Status == schemas.StatusWorking
	})
	if _, err := f.Fetch(t.Context(), "busy", "", false); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(*said, func(l string) bool {
		return strings.Contains(l, "agent busy is working on turn 1: its work so far is fetched")
	}) {
		t.Errorf("a fetch during a turn said %q", *said)
	}
}
