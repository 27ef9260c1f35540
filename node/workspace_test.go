package node_test

import (
	"os"
	"path/filepath"
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
// live agent's stays however long it runs.
func TestEndedCheckoutsGoAfterKeepFor(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	dir := t.TempDir()
	fabrictest.Node(t, srv, node.Config{Name: "a", Dir: dir, KeepFor: 300 * time.Millisecond, RefreshInterval: 50 * time.Millisecond,
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
