package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// An ended agent's checkout stays for the node's KeepFor and then goes; a
// live agent's stays however long it runs. (KeepFor was 300 ms: on a
// loaded machine the diff after the close came later, and found the
// checkout going.)
func TestEndedCheckoutsGoAfterKeepFor(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	dir := t.TempDir()
	fabrictest.Node(t, srv, node.Config{Name: "a", Dir: dir, KeepFor: 5 * time.Second, RefreshInterval: 50 * time.Millisecond,
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	repo := t.TempDir()
	gittest.Git(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "README"), []byte("hi\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, id := range []string{"ends", "stays"} {
		if _, err := f.OpenRepo(ctx, schemas.OpenRequest{ID: id}, client.RepoSource{Dir: repo}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Close(ctx, schemas.AgentRequest{AgentID: "ends"}); err != nil {
		t.Fatal(err)
	}
	checkout := func(id string) string { return filepath.Join(dir, "work", id) }
	if _, err := f.Diff(ctx, "ends", false); err != nil {
		t.Fatalf("an ended agent's diff, within KeepFor: %v", err)
	}
	poll.Until(t, 30*time.Second, "the ended agent's checkout goes", func() bool {
		_, err := os.Stat(checkout("ends"))
		return os.IsNotExist(err)
	})
	if _, err := f.Diff(ctx, "ends", false); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("the diff of an agent whose checkout went: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // past KeepFor: a live agent's stays
	if _, err := os.Stat(checkout("stays")); err != nil {
		t.Fatalf("a live agent's checkout went: %v", err)
	}
}

// An ended agent's checkout went at the sweep after KeepFor whether or not
// its work was being read: a diff or a fetch under way then failed with
// git's words for a repository that vanished under it. A checkout whose
// work is being read stays until the read ends; the next sweep takes it.
func TestEndedCheckoutStaysWhileItsWorkIsRead(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	dir := t.TempDir()
	keep := 300 * time.Millisecond
	fabrictest.Node(t, srv, node.Config{Name: "a", Dir: dir, KeepFor: keep, RefreshInterval: 50 * time.Millisecond,
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	repo := gittest.Repo(t, "README", "hi\n")
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := f.OpenRepo(ctx, schemas.OpenRequest{ID: "read"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	checkout := filepath.Join(dir, "work", "read")
	// The diff's git waits on HEAD, a FIFO, until the test writes it.
	head := filepath.Join(checkout, ".git", "HEAD")
	was, err := os.ReadFile(head)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(head); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(head, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Close(ctx, schemas.AgentRequest{AgentID: "read"}); err != nil {
		t.Fatal(err)
	}
	diffed := make(chan error, 1)
	go func() { _, err := f.Diff(ctx, "read", false); diffed <- err }()
	poll.Until(t, 30*time.Second, "the sweep to see the agent ended", func() bool {
		_, err := os.Stat(filepath.Join(dir, "work", "read.ended"))
		return err == nil
	})
	time.Sleep(4 * keep) // sweeps past KeepFor, while the diff waits
	if _, err := os.Stat(checkout); err != nil {
		t.Fatalf("an ended agent's checkout went while its diff was under way: %v", err)
	}
	// HEAD is written whole, then a regular file again for later reads.
	w, err := os.OpenFile(head, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(head)
	os.WriteFile(head, was, 0o644)
	w.Write(was)
	w.Close()
	if err := <-diffed; err != nil {
		t.Errorf("the diff under way when KeepFor passed: %v", err)
	}
	poll.Until(t, 30*time.Second, "the checkout to go once its diff ended", func() bool {
		_, err := os.Stat(checkout)
		return os.IsNotExist(err)
	})
}

// A node SIGKILLed while it received a repository left the whole bundle
// in the system's temporary directory (300 MB in /tmp, after two
// restarts). The node's scratch files are in its own directory's spool,
// which each start empties; an agent on a repository opens and its work
// comes back through it.
func TestNodeStartEmptiesWhatAKilledRunLeftInItsSpool(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	dir := t.TempDir()
	left := filepath.Join(dir, "spool", "shoal-bundle-4242")
	if err := os.MkdirAll(filepath.Dir(left), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fabrictest.Node(t, srv, node.Config{Name: "a", Dir: dir, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the bundle a killed run left in the node's spool is still there: %v", err)
	}
	repo := gittest.Repo(t, "a.txt", "a\n")
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: "spooled"}, client.RepoSource{Dir: repo, WithChanges: true}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "work", "spooled", "b.txt"), []byte("b\n"), 0o644)
	if got, err := f.Fetch(t.Context(), "spooled", "", false); err != nil || got.Files != 1 {
		t.Fatalf("the agent's work: %+v %v", got, err)
	}
	if names, _ := os.ReadDir(filepath.Join(dir, "spool")); len(names) != 0 {
		t.Errorf("the spool holds %d scratch files after the open and the fetch", len(names))
	}
}

// The commit of what an agent left uncommitted names the turn it got to;
// once the agent no longer ran on its node (the node restarted since) it
// said "as of turn 0". The record's turn is read then.
func TestSnapshotOfAnEndedAgentNamesItsLastTurn(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := node.Config{Name: "a", Dir: dir, Conn: natstest.Connect(t, srv), Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}}
	first, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- first.Run(stop) }()
	<-first.Ready()
	repo := gittest.Repo(t, "README", "hi\n")
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := f.OpenRepo(ctx, schemas.OpenRequest{ID: "ended"}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"one", "two"} {
		if _, err := f.Run(ctx, schemas.RunRequest{AgentID: "ended", Text: text}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "work", "ended", "left.txt"), []byte("uncommitted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The node stops (closing its agent) and starts again on its
	// directory: the checkout is there, the agent runs no more.
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	cfg.Conn = natstest.Connect(t, srv)
	fabrictest.Node(t, srv, cfg)
	if _, err := f.Fetch(ctx, "ended", repo, false); err != nil {
		t.Fatal(err)
	}
	if msg := gittest.Git(t, repo, "log", "-1", "--format=%B", "shoal/ended"); !strings.Contains(msg, "(as of turn 2)") {
		t.Errorf("the snapshot of the ended agent's work says %q; want it as of turn 2", msg)
	}
}
