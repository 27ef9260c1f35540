package client_test

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A repository whose bundle would pass the limit is refused before
// anything is sent or claimed, naming the limit; under it, the open goes
// through and the bundle is kept for the object store's day.
func TestOpenRepoRefusesABundlePastTheLimit(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	repo := t.TempDir()
	git := func(args ...string) { gittest.Git(t, repo, args...) }
	git("init", "-q", "-b", "main")
	noise := make([]byte, 64<<10) // incompressible: the bundle is at least this
	rand.Read(noise)
	os.WriteFile(filepath.Join(repo, "noise"), noise, 0o644)
	git("add", ".")
	git("commit", "-q", "-m", "noise")

	var said []string
	small, err := client.NewDirect(natstest.Connect(t, srv), client.Config{MaxBundle: 32 << 10, Progress: func(l string) { said = append(said, l) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	_, err = small.OpenRepo(ctx, schemas.OpenRequest{ID: "big", CWD: "/"}, client.RepoSource{Dir: repo})
	if err == nil || !strings.Contains(err.Error(), "past the limit of 32.0 KiB") || !strings.Contains(err.Error(), "node a lacks 1 commit of") {
		t.Fatalf("an open past the limit: %v", err)
	}
	if _, err := small.Record(ctx, "big"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("a refused open left a record: %v", err)
	}
	obs, err := small.JetStream().ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := obs.List(ctx); len(list) != 0 {
		t.Fatalf("a refused open stored %d objects", len(list))
	}
	for _, l := range said {
		if !strings.HasPrefix(l, "bundling ") {
			t.Fatalf("a refused open said more than that it was bundling: %q", said)
		}
	}

	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := f.OpenRepo(ctx, schemas.OpenRequest{ID: "fits"}, client.RepoSource{Dir: repo})
	if err != nil || rep.Node != "a" {
		t.Fatalf("an open under the limit: %+v %v", rep, err)
	}
	st, err := obs.Status(ctx)
	if err != nil || st.TTL() != broker.ReposTTL || broker.ReposTTL != 24*time.Hour {
		t.Fatalf("the object store keeps bundles %v (%v), want a day", st.TTL(), err)
	}
	if list, _ := obs.List(ctx); len(list) != 1 {
		t.Fatalf("an open stored %d objects, want its bundle", len(list))
	}

	// The way back is held to the same limit: work past it is not
	// copied to the caller's disk, whatever the node says of it.
	rec, err := f.Record(ctx, "fits")
	if err != nil || rec.Workspace == nil {
		t.Fatalf("the agent's record: %+v %v", rec, err)
	}
	more := make([]byte, 64<<10)
	rand.Read(more)
	if err := os.WriteFile(filepath.Join(rec.Workspace.Dir, "more"), more, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := small.Fetch(ctx, "fits", repo, false); err == nil || !strings.Contains(err.Error(), "more than 32.0 KiB: nothing was fetched") {
		t.Fatalf("a fetch of work past the limit: %v", err)
	}
	if _, err := f.Fetch(ctx, "fits", repo, false); err != nil {
		t.Fatalf("a fetch under the limit: %v", err)
	}
}
