package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// MaxHaves is how many of the commits a cache has it names to a caller,
// the newest first: the caller bundles what lies beyond them.
const MaxHaves = 64

// A Cache is a node's store of repositories: one bare repository for each
// repository identity, holding every commit shipped to the node. Agents
// never write to it: each has its own checkout reading its objects.
type Cache struct {
	Dir string

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// lock serializes the work on one repository of the cache.
func (c *Cache) lock(repo string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	l := c.locks[repo]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[repo] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// path is the bare repository of repo.
func (c *Cache) path(repo string) string { return filepath.Join(c.Dir, repo+".git") }

// Objects is the object directory of repo's cache, which checkouts read.
func (c *Cache) Objects(repo string) string { return filepath.Join(c.path(repo), "objects") }

// Has reports whether the cache holds commit of repo, and, when not, the
// newest commits it does hold (at most MaxHaves).
func (c *Cache) Has(ctx context.Context, repo, commit string) (bool, []string, error) {
	if !IsCommitID(repo) || !IsCommitID(commit) {
		return false, nil, fmt.Errorf("repository and commit must be full commit ids")
	}
	defer c.lock(repo)()
	dir := c.path(repo)
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return false, nil, nil
	}
	if known, err := present(ctx, dir, []string{commit}); err != nil {
		return false, nil, err
	} else if len(known) == 1 {
		return true, nil, nil
	}
	out, err := run(ctx, dir, nil, nil, "for-each-ref", "--sort=-committerdate", fmt.Sprintf("--count=%d", MaxHaves), "--format=%(objectname)", "refs/shoal/")
	if err != nil {
		return false, nil, err
	}
	return false, strings.Fields(out), nil
}

// Receive takes a bundle of repo's commit tip into the cache.
func (c *Cache) Receive(ctx context.Context, repo, bundle, tip string) error {
	if !IsCommitID(repo) || !IsCommitID(tip) {
		return fmt.Errorf("repository and commit must be full commit ids")
	}
	defer c.lock(repo)()
	dir := c.path(repo)
	if err := c.ensure(ctx, repo); err != nil {
		return err
	}
	return fetchBundle(ctx, dir, bundle, tip)
}

// ensure makes repo's cache, an empty one, if there is none. c.lock(repo)
// is held.
func (c *Cache) ensure(ctx context.Context, repo string) error {
	dir := c.path(repo)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		return nil
	}
	// Made aside and renamed, so a cache is never half made.
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(c.Dir, ".new-")
	if err != nil {
		return err
	}
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--bare", tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr != nil {
			return err
		}
	}
	return nil
}

// fetchBundle takes a bundle of commit tip into the repository at dir.
func fetchBundle(ctx context.Context, dir, bundle, tip string) error {
	if _, err := run(ctx, dir, nil, nil, "bundle", "verify", "--quiet", bundle); err != nil {
		return fmt.Errorf("the bundle does not apply to this node's copy of the repository: %v", err)
	}
	if _, err := run(ctx, dir, nil, nil, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", bundle, "+"+bundleRef+":refs/shoal/"+tip); err != nil {
		return err
	}
	if known, err := present(ctx, dir, []string{tip}); err != nil || len(known) != 1 {
		return fmt.Errorf("the bundle did not hold commit %s", tip)
	}
	return nil
}

// Keep names commit in repo's cache, so what an agent made stays among
// what the cache has.
func (c *Cache) Keep(ctx context.Context, repo, commit string) error {
	defer c.lock(repo)()
	_, err := run(ctx, c.path(repo), nil, nil, "update-ref", "refs/shoal/"+commit, commit)
	return err
}

// Checkout makes dst a repository of its own on branch at commit, reading
// the cache's objects of repo, with name and email as the identity of its
// commits. dst must not exist.
func (c *Cache) Checkout(ctx context.Context, repo, commit, dst, branch, name, email string) error {
	return c.checkout(ctx, repo, "", commit, dst, branch, name, email)
}

// CheckoutBundle is Checkout of commit tip, which a bundle carries, taken
// into dst's own objects rather than the cache's: what is one agent's, or
// one caller's not yet committed work, is read by no other checkout of
// the repository (each reads the cache), sandboxed or not.
func (c *Cache) CheckoutBundle(ctx context.Context, repo, bundle, tip, dst, branch, name, email string) error {
	if !IsCommitID(repo) || !IsCommitID(tip) {
		return fmt.Errorf("repository and commit must be full commit ids")
	}
	unlock := c.lock(repo)
	err := c.ensure(ctx, repo)
	unlock()
	if err != nil {
		return err
	}
	return c.checkout(ctx, repo, bundle, tip, dst, branch, name, email)
}

func (c *Cache) checkout(ctx context.Context, repo, bundle, commit, dst, branch, name, email string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("checkout %s already exists", dst)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	fail := func(err error) error {
		os.RemoveAll(dst)
		return err
	}
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", dst); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dst, ".git", "objects", "info", "alternates"), []byte(c.Objects(repo)+"\n"), 0o600); err != nil {
		return fail(err)
	}
	for _, kv := range [][2]string{{"user.name", name}, {"user.email", email}} {
		if _, err := run(ctx, dst, nil, nil, "config", kv[0], kv[1]); err != nil {
			return fail(err)
		}
	}
	if bundle != "" {
		if err := fetchBundle(ctx, dst, bundle, commit); err != nil {
			return fail(err)
		}
	}
	if _, err := run(ctx, dst, nil, nil, "checkout", "--quiet", "-b", branch, commit); err != nil {
		return fail(err)
	}
	return nil
}

// Diff is the agent's work in checkout dir against base, committed and not
// (untracked files included, ignored ones not), as git diff prints it; a
// summary of the files changed with stat.
func Diff(ctx context.Context, dir, base string, stat bool) (string, error) {
	tree, env, cleanup, err := workTree(ctx, dir)
	if err != nil {
		return "", err
	}
	defer cleanup()
	args := []string{"diff", "--no-color", "--no-ext-diff", "--no-textconv", base, tree}
	if stat {
		args = []string{"diff", "--no-color", "--no-ext-diff", "--no-textconv", "--stat", base, tree}
	}
	return run(ctx, dir, env, nil, args...)
}

// Changed is how many files the agent's work in dir changes against base.
func Changed(ctx context.Context, dir, base string) (int, error) {
	tree, env, cleanup, err := workTree(ctx, dir)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	out, err := run(ctx, dir, env, nil, "diff", "--name-only", "--no-renames", base, tree)
	return len(strings.Fields(out)), err
}

// workTree writes the tree of dir's files as they are and returns it,
// with the environment that reads it apart from dir's configuration
// (apart).
func workTree(ctx context.Context, dir string) (string, []string, func(), error) {
	tmp, err := os.MkdirTemp("", "shoal-diff-")
	if err != nil {
		return "", nil, nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	objects, err := objectDir(ctx, dir)
	if err != nil {
		cleanup()
		return "", nil, nil, err
	}
	head, err := line(ctx, dir, nil, "rev-parse", "HEAD")
	if err != nil {
		cleanup()
		return "", nil, nil, err
	}
	env, err := apart(ctx, dir, objects, tmp)
	if err != nil {
		cleanup()
		return "", nil, nil, err
	}
	commit, err := snapshotTree(ctx, dir, objects, objects, filepath.Join(tmp, "index"), head, "work", "shoal", "shoal@localhost", env...)
	if err != nil {
		cleanup()
		return "", nil, nil, err
	}
	return commit + "^{tree}", env, cleanup, nil
}

// apart is the environment in which git reads the agent's checkout at dir
// (its files and its objects) with a repository directory of its own,
// made in tmp: no configuration, attributes or hooks of the checkout's.
// The agent writes its checkout's .git, and git would run what a filter,
// a diff driver or core.fsmonitor there names, as the node and outside
// any sandbox the agent is in; a .gitattributes naming a filter no
// configuration defines does nothing.
func apart(ctx context.Context, dir, objects, tmp string) ([]string, error) {
	format, err := line(ctx, dir, nil, "rev-parse", "--show-object-format")
	if err != nil {
		return nil, err
	}
	gitDir := filepath.Join(tmp, "git")
	for _, d := range []string{"objects", "refs"} {
		if err := os.MkdirAll(filepath.Join(gitDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	config := "[core]\n\trepositoryformatversion = 0\n"
	if format != "" && format != "sha1" {
		config = "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = " + format + "\n"
	}
	if err := os.WriteFile(filepath.Join(gitDir, "config"), []byte(config), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(gitDir, "HEAD"), []byte("ref: refs/heads/shoal\n"), 0o600); err != nil {
		return nil, err
	}
	return []string{"GIT_DIR=" + gitDir, "GIT_WORK_TREE=" + dir, "GIT_OBJECT_DIRECTORY=" + objects}, nil
}

// Snapshot is the commit of the agent's work in dir: HEAD, or a commit of
// its uncommitted work on top, with message, by name and email. The
// checkout's branch does not move.
func Snapshot(ctx context.Context, dir, message, name, email string) (string, error) {
	tmp, err := os.MkdirTemp("", "shoal-snap-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	objects, err := objectDir(ctx, dir)
	if err != nil {
		return "", err
	}
	head, err := line(ctx, dir, nil, "rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	env, err := apart(ctx, dir, objects, tmp)
	if err != nil {
		return "", err
	}
	return snapshotTree(ctx, dir, objects, objects, filepath.Join(tmp, "index"), head, message, name, email, env...)
}

// BundleWork writes to path a bundle of commit tip of checkout dir beyond
// the haves (commits its reader holds; those dir does not know are left
// out), for Land or Receive; it returns how many commits it holds.
func BundleWork(ctx context.Context, dir, tip string, haves []string, path string) (int, error) {
	objects, err := objectDir(ctx, dir)
	if err != nil {
		return 0, err
	}
	return writeBundle(ctx, objects, tip, haves, path)
}
