package workspace

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// What a node sends as an agent's work is a bundle of at most 2 GiB, but
// what it says in the commits of the caller's branch is not bounded by
// that: a commit's message compresses a thousandfold. A second fetch
// (the agent rewrote its history, or its node says so) makes Land read
// `git log tip..old` of the branch's earlier commits whole, subjects and
// all, into memory, where it needs three of them and a count: a bundle
// of a few hundred KiB holds the caller's shoal process to hundreds of
// MiB, and one of 2 GiB to far more than any machine has.
func TestLandHoldsWhatItReadsOfTheBranchItMoves(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	base := git(t, repo, "rev-parse", "HEAD")

	// The node's side: commits on base, by "the agent", each with a
	// message of 8 MiB on one line.
	node := t.TempDir()
	git(t, node, "clone", "-q", repo, ".")
	msg := filepath.Join(t.TempDir(), "msg")
	tree := git(t, node, "rev-parse", "HEAD^{tree}")
	agent := []string{"GIT_AUTHOR_NAME=shoal agent a1", "GIT_AUTHOR_EMAIL=a1@shoal.invalid", "GIT_COMMITTER_NAME=shoal agent a1", "GIT_COMMITTER_EMAIL=a1@shoal.invalid"}
	parent := base
	for i := range 6 {
		if err := os.WriteFile(msg, []byte(strings.Repeat(string(rune('a'+i)), 8<<20)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := gitter{}.line(ctx, node, agent, "commit-tree", tree, "-p", parent, "-F", msg)
		if err != nil {
			t.Fatal(err)
		}
		parent = out
	}
	bundle := func(tip string) string {
		git(t, node, "update-ref", bundleRef, tip)
		b := filepath.Join(t.TempDir(), "work.bundle")
		git(t, node, "bundle", "create", "-q", b, bundleRef, "^"+base)
		return b
	}
	first := bundle(parent)
	fi, _ := os.Stat(first)
	if err := Land(ctx, repo, first, parent, "shoal/a1", false); err != nil {
		t.Fatal(err)
	}

	// The second fetch: the agent's work is now one plain commit on base.
	second, err := gitter{}.line(ctx, node, agent, "commit-tree", tree, "-p", base, "-m", "work")
	if err != nil {
		t.Fatal(err)
	}
	b2 := bundle(second)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = Land(ctx, repo, b2, second, "shoal/a1", true)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	took := after.TotalAlloc - before.TotalAlloc
	t.Logf("a bundle of %d KiB made the second fetch allocate %d MiB", fi.Size()>>10, took>>20)
	if took > 32<<20 {
		t.Errorf("Land allocated %d MiB reading the branch it moves, after a bundle of %d KiB: what it reads of the branch's old commits is not bounded", took>>20, fi.Size()>>10)
	}
}
