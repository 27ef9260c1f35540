package client_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// submoduleRepo is a caller's repository with a populated
// submodule "sub" cloned from subOrigin, and the agent opened on it.
func submoduleRepo(t *testing.T, id string) (f *client.Direct, repo, subOrigin, checkout string) {
	t.Helper()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	subOrigin = gittest.Repo(t, "lib.txt", "lib\n")
	repo = gittest.Repo(t, "app.txt", "app\n")
	gittest.Git(t, repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", subOrigin, "sub")
	gittest.Git(t, repo, "commit", "-q", "-m", "add the submodule")

	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.OpenRepo(t.Context(), schemas.OpenRequest{ID: id}, client.RepoSource{Dir: repo}); err != nil {
		t.Fatal(err)
	}
	rec, err := f.Record(t.Context(), id)
	if err != nil || rec.Workspace == nil {
		t.Fatalf("the agent's record: %+v %v", rec, err)
	}
	return f, repo, subOrigin, rec.Workspace.Dir
}

// bumpSubmodule is the agent's commit moving the submodule to commit c
// (any 40 hex digits: the agent needs nothing of the submodule).
func bumpSubmodule(t *testing.T, checkout, c string) {
	t.Helper()
	gittest.Git(t, checkout, "update-index", "--cacheinfo", "160000,"+c+",sub")
	gittest.Git(t, checkout, "commit", "-q", "-m", "bump the submodule")
}

// An agent whose work moves a submodule's commit makes shoal fetch run
// git fetch in the caller's submodule, against the submodule's remote:
// Land's git fetch of the bundle recurses into submodules
// (fetch.recurseSubmodules defaults to on-demand). The caller's
// submodule's remote-tracking refs move (and its FETCH_HEAD is written),
// though the README says no other ref moves, whatever the node answers,
// and no remote is reached.
func TestFetchMovesNoRefOfASubmodule(t *testing.T) {
	t.Parallel()
	f, repo, subOrigin, checkout := submoduleRepo(t, "subref")
	subGit := filepath.Join(repo, ".git", "modules", "sub")
	before := gittest.Git(t, subGit, "for-each-ref")

	// The submodule's remote has moved on since the caller cloned it.
	os.WriteFile(filepath.Join(subOrigin, "lib.txt"), []byte("lib 2\n"), 0o644)
	gittest.Git(t, subOrigin, "commit", "-q", "-am", "upstream")
	bumpSubmodule(t, checkout, gittest.Git(t, subOrigin, "rev-parse", "HEAD"))

	if _, err := f.Fetch(t.Context(), "subref", "", false); err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if after := gittest.Git(t, subGit, "for-each-ref"); after != before {
		t.Fatalf("shoal fetch moved refs of the caller's submodule:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// The same, when the submodule's remote does not answer (a host that is
// down, a VPN not up): shoal fetch connects to it and waits for it with
// no bound; shoal job fetches under context.WithoutCancel, so a job
// waits for ever. Here the remote is a listener on 127.0.0.1 that
// accepts and never answers; the fetch is given 20 seconds.
func TestFetchReachesNoSubmoduleRemote(t *testing.T) {
	t.Parallel()
	f, repo, _, checkout := submoduleRepo(t, "subnet")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	// The person's submodule remote, as their clone configured it.
	gittest.Git(t, filepath.Join(repo, ".git", "modules", "sub"), "config", "remote.origin.url", "git://"+l.Addr().String()+"/lib.git")
	bumpSubmodule(t, checkout, strings.Repeat("ab", 20))

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	began := time.Now()
	_, err = f.Fetch(ctx, "subnet", "", false)
	if n := conns.Load(); n > 0 || err != nil {
		t.Fatalf("shoal fetch connected %d times to the caller's submodule remote %s and returned after %s: %v",
			n, l.Addr(), time.Since(began).Round(time.Second), err)
	}
}
