package node_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// A sandboxed agent on a repository may write its own checkout, .git
// included, and nothing outside it. Its node runs git in that checkout,
// unconfined, for `shoal diff` and `shoal fetch`: git there would read the
// checkout's own .git/config, so a clean filter, a textconv or
// core.fsmonitor the agent planted would run as the node, outside the
// sandbox, and write the file the agent could not. The node's git reads
// the checkout with a repository directory of its own.
func TestSandboxedAgentCannotRunCodeOnItsNodeThroughItsCheckoutsGitConfig(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	home, outside := t.TempDir(), t.TempDir()
	escaped := filepath.Join(outside, "escaped")
	repo := gittest.Repo(t, "README", "hi\n")

	// Turn 1: the sandbox holds: a write outside is refused.
	// Turn 2: a filter in its own .git/config, named by .gitattributes.
	fake.Script(
		bash("echo direct > "+escaped+"; echo rc=$?"), fakemodel.Reply{Text: "Tried."},
		bash(`git config filter.x.clean "sh -c 'id > `+escaped+`; cat'" && git config diff.y.textconv "sh -c 'id > `+escaped+`.textconv; cat'" && `+
			`git config core.fsmonitor "sh -c 'id > `+escaped+`.fsmonitor'" && printf '* filter=x diff=y\n' > .gitattributes && echo new > new.txt && echo planted`),
		fakemodel.Reply{Text: "Planted."},
	)
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second}})
	yes := true
	ctx := f.ctx(3 * time.Minute)
	op, err := f.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: "boxed", Permission: "bypass", Sandbox: &yes}, client.RepoSource{Dir: repo})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := f.fabric.Status(ctx, op.AgentID); err != nil || rec.Sandbox == nil || rec.Sandbox.Kernel == "" {
		t.Fatalf("the agent is not sandboxed: %+v %v", rec.Sandbox, err)
	}
	if rep, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: "Write outside."}); err != nil || rep.Text != "Tried." {
		t.Fatalf("turn 1: %+v %v", rep, err)
	}
	if r := fake.Requests()[1].ToolResults; len(r) != 1 || !refused(r[0].Content) {
		t.Fatalf("the sandbox let the agent write outside: %+v", r)
	}
	if _, err := os.Stat(escaped); !os.IsNotExist(err) {
		t.Fatalf("the sandboxed agent wrote %s itself: %v", escaped, err)
	}
	if rep, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: "Plant."}); err != nil || rep.Text != "Planted." {
		t.Fatalf("turn 2: %+v %v", rep, err)
	}
	if r := fake.Requests()[3].ToolResults; len(r) != 1 || !strings.Contains(r[0].Content, "planted") {
		t.Fatalf("the plant: %+v", r)
	}

	// Someone asks for its diff: the node's git, not the sandbox's, runs
	// what the agent planted.
	diff, err := f.fabric.Diff(ctx, op.AgentID, false)
	if err != nil {
		t.Fatalf("the diff: %v", err)
	}
	if !strings.Contains(diff.Diff, "+new") {
		t.Errorf("the diff does not hold the agent's new file:\n%s", diff.Diff)
	}
	// And when its work is fetched (a commit of what it did not commit,
	// bundled by its node).
	if _, err := f.fabric.Fetch(ctx, op.AgentID, repo, false); err != nil {
		t.Fatalf("the fetch: %v", err)
	}
	for _, planted := range []string{escaped, escaped + ".textconv", escaped + ".fsmonitor"} {
		if b, err := os.ReadFile(planted); err == nil {
			t.Errorf("what the sandboxed agent planted in its checkout's git configuration ran unconfined on its node, and wrote %s: %q", planted, b)
		}
	}
}

// The node's cache of a repository is readable to every sandboxed agent
// on it (its checkout reads the cache's objects), and it holds what came
// to the node for any agent: here agent b's uncommitted work, carried
// into the cache when b was reopened on this node. Agent a, sandboxed,
// not of b's tree (it may not even read b's output), reads it with one
// git command; the sandbox is to keep it to its own directory and the
// files the node wrote for it.
func TestSandboxedAgentCannotReadAnotherAgentsWorkThroughTheCache(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	repo := gittest.Repo(t, "README", "hi\n")
	cfg := func() claude.Config {
		return claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}
	}
	n1 := startNode(t, fixtureOptions{claude: cfg()})
	startNode(t, fixtureOptions{claude: cfg(), broker: n1.b, node: func(c *node.Config) { c.Name = "n2" }})
	ctx := n1.ctx(3 * time.Minute)

	fake.Script(bash("echo TOPSECRET-of-b > notes.txt && echo wrote"), fakemodel.Reply{Text: "Noted."},
		bash("git cat-file --batch-all-objects --batch | grep -a TOPSECRET || echo nothing"), fakemodel.Reply{Text: "Looked."})
	if _, err := n1.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: "b", Node: "n2", Permission: "bypass"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	if rep, err := n1.fabric.Run(ctx, schemas.RunRequest{AgentID: "b", Text: "Take notes."}); err != nil || rep.Text != "Noted." {
		t.Fatalf("b's turn: %+v %v", rep, err)
	}
	n1.fabric.Close(ctx, schemas.AgentRequest{AgentID: "b"})
	if _, err := n1.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: "b", Node: "n1", Permission: "bypass"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}

	yes := true
	if _, err := n1.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: "a", Node: "n1", Permission: "bypass", Sandbox: &yes}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	if rec, err := n1.fabric.Status(ctx, "a"); err != nil || rec.Sandbox == nil || rec.Sandbox.Kernel == "" {
		t.Fatalf("agent a is not sandboxed: %+v %v", rec.Sandbox, err)
	}
	if rep, err := n1.fabric.Run(ctx, schemas.RunRequest{AgentID: "a", Text: "Look around."}); err != nil || rep.Text != "Looked." {
		t.Fatalf("a's turn: %+v %v", rep, err)
	}
	r := fake.Requests()[3].ToolResults
	if len(r) != 1 {
		t.Fatalf("a's tool results: %+v", r)
	}
	if strings.Contains(r[0].Content, "TOPSECRET-of-b") {
		t.Fatalf("sandboxed agent a read agent b's uncommitted work from its node's shared cache:\n%s", r[0].Content)
	}
}

// A sandboxed agent writes its checkout's .git as it likes: an alternate
// object directory and a branch that are another repository's (one the
// node's user can read, the agent cannot), or a .git file naming another
// agent's checkout. Its node's git for diff and fetch must not follow
// them as the node: the other repository's commit, or the other agent's
// uncommitted work, would reach the caller in the fetched branch, and the
// agent in its next open.
func TestSandboxedAgentsGitDirLeadsItsNodeNowhere(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	repo, private := gittest.Repo(t, "README", "hi\n"), gittest.Repo(t, "key.txt", "PRIVATE-KEY-MATERIAL\n")
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	ctx := f.ctx(3 * time.Minute)
	yes := true

	// v, not sandboxed, starts on uncommitted work of the caller's, which
	// then leaves the caller's files.
	os.WriteFile(filepath.Join(repo, "victim.txt"), []byte("VICTIM-SECRET\n"), 0o644)
	if _, err := f.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: "v", Permission: "bypass"}, client.RepoSource{Dir: repo, WithChanges: true}); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(repo, "victim.txt"))

	fake.Script(
		bash("echo "+private+"/.git/objects >> .git/objects/info/alternates && ln -s "+private+"/.git/refs/heads/main .git/refs/heads/loot && echo 'ref: refs/heads/loot' > .git/HEAD && echo planted"),
		fakemodel.Reply{Text: "Planted."},
		bash("mv .git .git-mine && echo 'gitdir: ../v/.git' > .git && echo planted"),
		fakemodel.Reply{Text: "Planted."},
	)
	for _, id := range []string{"alt", "gitfile"} {
		if _, err := f.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: id, Permission: "bypass", Sandbox: &yes}, client.RepoSource{Dir: repo}); err != nil {
			t.Fatal(err)
		}
		if rec, err := f.fabric.Status(ctx, id); err != nil || rec.Sandbox == nil || rec.Sandbox.Kernel == "" {
			t.Fatalf("agent %s is not sandboxed: %+v %v", id, rec.Sandbox, err)
		}
		if rep, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: id, Text: "Plant."}); err != nil || rep.Text != "Planted." {
			t.Fatalf("%s's turn: %+v %v", id, rep, err)
		}
	}
	for i, r := range fake.Requests() {
		if len(r.ToolResults) == 1 && !strings.Contains(r.ToolResults[0].Content, "planted") {
			t.Fatalf("request %d: the plant failed: %s", i, r.ToolResults[0].Content)
		}
	}

	secrets := []string{"PRIVATE-KEY-MATERIAL", "VICTIM-SECRET"}
	for _, id := range []string{"alt", "gitfile"} {
		if diff, err := f.fabric.Diff(ctx, id, false); err == nil {
			for _, s := range secrets {
				if strings.Contains(diff.Diff, s) {
					t.Errorf("agent %s's diff holds %s, which its sandbox keeps from it:\n%s", id, s, diff.Diff)
				}
			}
		}
		_, err := f.fabric.Fetch(ctx, id, repo, false)
		t.Logf("fetch of %s: %v", id, err)
		all := gittest.Git(t, repo, "cat-file", "--batch-all-objects", "--batch")
		for _, s := range secrets {
			if strings.Contains(all, s) {
				t.Errorf("the fetch of agent %s brought %s into the caller's repository", id, s)
			}
		}
	}
}

// An agent's .git/index made a link to a FIFO (or to a file the agent
// cannot read), its HEAD a FIFO: its node's diff of it fails, and the
// node's other agents' diffs are answered meanwhile, however many diffs
// of it wait; the node stops when asked. The node read the index whole,
// following links and blocking on the FIFO, and one request held every
// other diff of the node; then an agent's diffs of itself, one per
// reader, held them all.
func TestAnAgentsCheckoutHoldsUpNoOtherDiff(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	repo := gittest.Repo(t, "README", "hi\n")
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}})
	ctx := f.ctx(3 * time.Minute)
	for _, id := range []string{"jam", "head", "other"} {
		if _, err := f.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: id, Permission: "bypass"}, client.RepoSource{Dir: repo}); err != nil {
			t.Fatal(err)
		}
	}
	fake.Script(bash("echo mine > mine.txt"), fakemodel.Reply{Text: "Wrote."})
	if _, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: "other", Text: "Go."}); err != nil {
		t.Fatalf("other's turn: %v", err)
	}
	// What jam's and head's agents would do in their checkouts, done for
	// them: an agent's CLI reading its own git after its HEAD became a
	// FIFO hangs its turn (the claude CLI sometimes does, under load).
	plantIn := func(id, script string) {
		t.Helper()
		rec, err := f.fabric.Record(ctx, id)
		if err != nil || rec.Workspace == nil {
			t.Fatalf("%s's record: %+v %v", id, rec, err)
		}
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = rec.Workspace.Dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	plantIn("jam", "mkfifo .git/fifo && mv .git/index .git/index.real && ln -s fifo .git/index")
	plantIn("head", "mkfifo .git/HEAD.fifo && mv .git/HEAD.fifo .git/HEAD")
	if _, err := f.fabric.Diff(ctx, "jam", false); err == nil || !strings.Contains(err.Error(), "index") {
		t.Errorf("the diff of an agent whose index is a link to a FIFO: %v; want a refusal naming the index", err)
	}
	// head's diffs wait on its FIFO until the request's deadline, one
	// after the other, more of them than the node's four readers;
	// other's is answered meanwhile.
	stuck := make(chan error, 5)
	for range 5 {
		go func() { _, err := f.fabric.Diff(ctx, "head", false); stuck <- err }()
	}
	time.Sleep(2 * time.Second) // its git is waiting on the FIFO
	quick, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if diff, err := f.fabric.Diff(quick, "other", false); err != nil || !strings.Contains(diff.Diff, "+mine") {
		t.Fatalf("another agent's diff while one waits on a FIFO: %+v %v", diff, err)
	}
	select {
	case err := <-stuck:
		t.Logf("head's diff: %v", err)
	default:
	}
}
