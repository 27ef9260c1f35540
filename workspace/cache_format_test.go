package workspace

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// A node's cache is one bare repository per repository identity, shared
// by every caller that opens an agent on that repository there. It was
// made in the object format the first bundle's header named, before the
// bundle was verified, and kept when it was refused: a file that was no
// more than a v3 header claiming sha256, sent for another caller's SHA-1
// repository, made its cache SHA-256, and every real bundle of it was
// refused on that node from then on. The identity (a commit) says the
// format; a bundle that disagrees is refused before anything is made.
func TestCacheFormatIsNotTheFirstBundlesToChoose(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	s, err := Prepare(ctx, repo, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Repo) != 40 {
		t.Fatalf("a SHA-1 repository's identity is %q", s.Repo)
	}
	cache := &Cache{Dir: t.TempDir()}

	// The hostile caller's "bundle" for s.Repo: a header and nothing more.
	bogus := filepath.Join(t.TempDir(), "bogus.bundle")
	if err := os.WriteFile(bogus, []byte("# v3 git bundle\n@object-format=sha256\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cache.Receive(ctx, s.Repo, bogus, s.Commit); err == nil {
		t.Fatal("a bundle of nothing was received")
	}
	if f, err := objectFormat(ctx, gitter{}, cache.path(s.Repo)); err == nil && f != "sha1" {
		t.Errorf("the refused bundle left the cache of SHA-1 repository %.12s made in %s", s.Repo, f)
	}

	// The repository's own caller, afterwards.
	b := filepath.Join(t.TempDir(), "b")
	if _, err := s.Bundle(ctx, nil, b); err != nil {
		t.Fatal(err)
	}
	if err := cache.Receive(ctx, s.Repo, b, s.Commit); err != nil {
		t.Fatalf("the real bundle of repository %.12s is refused once another caller sent a SHA-256 header for it: %v", s.Repo, err)
	}
}
