package client_test

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// BenchmarkRepoTransfer opens an agent on a 100 MB repository (twenty
// files of incompressible data over five commits) on a node that holds
// none of it, and, in the same run, does what a person would without
// Shoal: git bundle create, a copy, git clone from the bundle. Each
// round uses a new node and sends the bundle afresh. It reports both
// times, the ratio, and Shoal's rate.
func BenchmarkRepoTransfer(b *testing.B) {
	repo := b.TempDir()
	git := func(dir string, args ...string) { gittest.Git(b, dir, args...) }
	git(repo, "init", "-q", "-b", "main")
	const size = 100 << 20
	data := make([]byte, size/20)
	for c := range 5 {
		for f := range 4 {
			rand.Read(data)
			os.WriteFile(filepath.Join(repo, fmt.Sprintf("data%d-%d.bin", c, f)), data, 0o644)
		}
		git(repo, "add", ".")
		git(repo, "commit", "-q", "-m", fmt.Sprintf("commit %d", c))
	}
	srv := natstest.Start(b)
	f, err := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	var shoal, plain time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("n%d", i)
		fabrictest.Node(b, srv, node.Config{Name: name, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
		t0 := time.Now()
		if _, err := f.OpenRepo(ctx, schemas.OpenRequest{ID: fmt.Sprintf("t%d", i), Node: name}, client.RepoSource{Dir: repo}); err != nil {
			b.Fatal(err)
		}
		shoal += time.Since(t0)
		obs, err := f.JetStream().ObjectStore(ctx, schemas.ReposBucket)
		if err != nil {
			b.Fatal(err)
		}
		list, _ := obs.List(ctx)
		for _, o := range list {
			obs.Delete(ctx, o.Name) // the next round sends it again
		}

		there := b.TempDir()
		t0 = time.Now()
		git(repo, "bundle", "create", "-q", filepath.Join(there, "out.bundle"), "--all")
		cp := exec.Command("cp", filepath.Join(there, "out.bundle"), filepath.Join(there, "in.bundle"))
		if out, err := cp.CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
		git(there, "clone", "-q", filepath.Join(there, "in.bundle"), "clone")
		plain += time.Since(t0)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(shoal), "shoal-ms")
	b.ReportMetric(ms(plain), "bundle+copy+clone-ms")
	b.ReportMetric(float64(shoal)/float64(plain), "ratio")
	b.ReportMetric(float64(size)/(1<<20)/(shoal.Seconds()/float64(b.N)), "shoal-MB/s")
}
