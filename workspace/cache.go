package workspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
	if known, err := present(ctx, gitter{}, dir, []string{commit}); err != nil {
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
	if err := bundleOf(repo, bundle); err != nil {
		return err
	}
	defer c.lock(repo)()
	dir := c.path(repo)
	if err := c.ensure(ctx, repo); err != nil {
		return err
	}
	return fetchBundle(ctx, dir, bundle, tip)
}

// bundleOf refuses a bundle whose objects are not named the way repo's
// are: a repository's identity is one of its commits, so its length
// says its hash (sha1 or sha256), whatever a bundle's header claims.
func bundleOf(repo, bundle string) error {
	h, err := readBundleHeader(bundle)
	if err != nil {
		return err
	}
	if want := formatOf(repo); h.format != want {
		return fmt.Errorf("a bundle of %s objects for repository %.12s, whose objects are %s", h.format, repo, want)
	}
	return nil
}

// formatOf is the hash a repository whose identity (a commit) is repo
// names its objects by.
func formatOf(repo string) string {
	if len(repo) == 64 {
		return "sha256"
	}
	return "sha1"
}

// ensure makes repo's cache, an empty one of objects named by repo's
// hash, if there is none. c.lock(repo) is held.
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
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--bare", "--object-format="+formatOf(repo), tmp); err != nil {
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
	if _, err := run(ctx, dir, nil, nil, fetchArgs(bundle, "+"+bundleRef+":refs/shoal/"+tip)...); err != nil {
		return err
	}
	if known, err := present(ctx, gitter{}, dir, []string{tip}); err != nil || len(known) != 1 {
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
	if err := bundleOf(repo, bundle); err != nil {
		return err
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
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--object-format="+formatOf(repo), dst); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dst, ".git", "objects", "info", "alternates"), []byte(alternates([]string{c.Objects(repo)}, "\n")+"\n"), 0o600); err != nil {
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
	if err := fits(ctx, dst, commit); err != nil {
		return fail(err)
	}
	if _, err := run(ctx, dst, nil, nil, "checkout", "--quiet", "-b", branch, commit); err != nil {
		return fail(err)
	}
	return nil
}

// maxFiles bounds the files of a checkout: a tree may name one blob, or
// one tree, any number of times, so an agent's few kilobytes of commit
// can check out as terabytes (a "git bomb").
const maxFiles = 1_000_000

// fits refuses commit's checkout in repository dir when it would hold
// more than maxFiles files, or take more than half the disk space free
// where dir is: counted from its tree as git will write it, read a line
// at a time and stopped at the bound.
func fits(ctx context.Context, dir, commit string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	room := uint64(st.Bavail) * uint64(st.Bsize) / 2
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "ls-tree", "-r", "-l", "-z", commit)
	cmd.Dir, cmd.Env = dir, cleanEnv(nil)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cancel(); cmd.Wait() }() // stopped first when the bound is passed
	var files, size uint64
	r := bufio.NewReader(out)
	for {
		entry, err := r.ReadString(0)
		if err != nil {
			break
		}
		// <mode> <type> <object> <size>\t<path>
		meta, _, _ := strings.Cut(entry, "\t")
		f := strings.Fields(meta)
		if len(f) == 4 && f[1] == "blob" {
			n, _ := strconv.ParseUint(f[3], 10, 64)
			size += n
		}
		files++
		switch {
		case files > maxFiles:
			return fmt.Errorf("commit %.12s would check out more than %d files: not checked out", commit, maxFiles)
		case size > room:
			return fmt.Errorf("commit %.12s would check out more than %d MiB, past half the %d MiB free on this node's disk: not checked out", commit, size>>20, 2*room>>20)
		}
	}
	return nil
}

// A Checkout is an agent's checkout, as its node reads it for the agent's
// work (Diff, Changed, Snapshot, BundleWork).
//
// The agent writes everything in it, .git included, so where git finds
// the repository (a .git file), its objects (objects/info/alternates),
// its refs (symbolic links) and its index are the agent's to point
// anywhere, a FIFO among them. A git the node runs there reads what they
// point at as the node: for a sandboxed agent, what its sandbox keeps
// from it (another repository, another agent's work), which would come
// back in a bundle the agent's next open reads. With Jail set, each such
// git runs confined as the agent is, so it reads nothing the agent could
// not read itself; and the index, which the node copies, is read only
// from the checkout's own .git directory, never through a link, and only
// as a regular file of bounded size.
type Checkout struct {
	Dir string
	// Tmp is where its reads make their scratch files (a bundle of the
	// agent's work is as large as the work); the system's temporary
	// directory when empty.
	Tmp string
	// Jail, when set, confines each git that reads the checkout.
	Jail Jail
	// Excludes are patterns, in .gitignore's form, that a snapshot of
	// the checkout's files leaves out too: the caller's own (CallerExcludes).
	Excludes string
}

// A Jail returns argv run confined to reading the system, the checkout
// and the cache's objects, and writing the checkout and writable.
type Jail func(argv []string, writable ...string) ([]string, error)

// MaxOutput bounds what the node takes of a git reading a checkout (a
// diff, most of all): the agent's files may be any size, and the node
// holds the output whole.
const MaxOutput = 32 << 20

// git is the gitter for the checkout's gits, which may write writable too.
func (c Checkout) git(writable ...string) gitter {
	if c.Jail == nil {
		return gitter{max: MaxOutput}
	}
	return gitter{jail: c.Jail, writable: writable, max: MaxOutput}
}

// Diff is the agent's work against base, committed and not (untracked
// files included, ignored ones not), as git diff prints it; a summary of
// the files changed with stat.
func (c Checkout) Diff(ctx context.Context, base string, stat bool) (string, error) {
	tree, g, env, cleanup, err := c.workTree(ctx)
	if err != nil {
		return "", err
	}
	defer cleanup()
	args := []string{"diff", "--no-color", "--no-ext-diff", "--no-textconv", "-M"}
	if stat {
		args = append(args, "--stat")
	}
	return g.run(ctx, c.Dir, env, nil, append(args, base, tree)...)
}

// Changed is how many files the agent's work changes against base.
func (c Checkout) Changed(ctx context.Context, base string) (int, error) {
	tree, g, env, cleanup, err := c.workTree(ctx)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	// Each name ends in a NUL: a name may hold spaces and newlines. A
	// file renamed is one file changed, as in the stat (Diff).
	out, err := g.run(ctx, c.Dir, env, nil, "diff", "-z", "--name-only", "-M", base, tree)
	return strings.Count(out, "\x00"), err
}

// workTree writes the tree of the checkout's files as they are and
// returns it, with the gitter and environment that read it apart from the
// checkout's configuration (apart).
func (c Checkout) workTree(ctx context.Context) (string, gitter, []string, func(), error) {
	tmp, err := os.MkdirTemp(c.Tmp, "shoal-diff-")
	if err != nil {
		return "", gitter{}, nil, nil, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	g := c.git(tmp)
	commit, env, err := c.snapshot(ctx, g, tmp, "work", "shoal", "shoal@localhost")
	if err != nil {
		cleanup()
		return "", gitter{}, nil, nil, err
	}
	return commit + "^{tree}", g, env, cleanup, nil
}

// snapshot commits the checkout's files as they are on top of its HEAD,
// through g, with tmp its scratch directory; it returns the commit and
// the environment that reads it.
func (c Checkout) snapshot(ctx context.Context, g gitter, tmp, message, name, email string) (string, []string, error) {
	objects, err := objectDir(ctx, g, c.Dir)
	if err != nil {
		return "", nil, err
	}
	head, err := g.line(ctx, c.Dir, nil, "rev-parse", "HEAD")
	if err != nil {
		return "", nil, err
	}
	env, err := apart(ctx, g, c.Dir, objects, tmp)
	if err != nil {
		return "", nil, err
	}
	if c.Excludes != "" {
		info := filepath.Join(tmp, "git", "info")
		if err := os.MkdirAll(info, 0o700); err != nil {
			return "", nil, err
		}
		if err := os.WriteFile(filepath.Join(info, "exclude"), []byte(c.Excludes), 0o600); err != nil {
			return "", nil, err
		}
	}
	index := filepath.Join(tmp, "index")
	if err := copyOwnIndex(c.Dir, index); err != nil {
		return "", nil, err
	}
	// Dated as the commit it is made on: the same work fetched again is
	// the same commit, whose bundle is stored once, not once a fetch.
	// Read apart, as the rest: a git reading the checkout's own
	// configuration ran what the agent set (log.showSignature and a
	// gpg.program of its own, on a commit it signed). Only a number is
	// taken for a date.
	dated := env
	if when, err := g.line(ctx, c.Dir, env, "show", "-s", "--no-show-signature", "--format=%ct", head); err == nil && isDigits(when) {
		dated = append(slices.Clip(env), "GIT_AUTHOR_DATE=@"+when+" +0000", "GIT_COMMITTER_DATE=@"+when+" +0000")
	}
	commit, _, err := snapshotTree(ctx, g, c.Dir, []string{objects}, objects, index, false, true, head, message, name, email, dated...)
	return commit, env, err
}

// isDigits reports whether s is a decimal number of 1 to 19 digits.
func isDigits(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// apart is the environment in which git reads the agent's checkout at dir
// (its files and its objects) with a repository directory of its own,
// made in tmp: no configuration, attributes or hooks of the checkout's.
// The agent writes its checkout's .git, and git would run what a filter,
// a diff driver or core.fsmonitor there names, as the node and outside
// any sandbox the agent is in; a .gitattributes naming a filter no
// configuration defines does nothing.
func apart(ctx context.Context, g gitter, dir, objects, tmp string) ([]string, error) {
	format, err := g.line(ctx, dir, nil, "rev-parse", "--show-object-format")
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

// Snapshot is the commit of the agent's work: HEAD, or a commit of its
// uncommitted work on top, with message, by name and email. The
// checkout's branch does not move.
func (c Checkout) Snapshot(ctx context.Context, message, name, email string) (string, error) {
	tmp, err := os.MkdirTemp(c.Tmp, "shoal-snap-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	commit, _, err := c.snapshot(ctx, c.git(tmp), tmp, message, name, email)
	return commit, err
}

// BundleWork writes to path a bundle of commit tip of the checkout beyond
// the haves (commits its reader holds; those the checkout does not know
// are left out), for Land or Receive; it returns how many commits it
// holds.
func (c Checkout) BundleWork(ctx context.Context, tip string, haves []string, path string) (int, error) {
	tmp, err := os.MkdirTemp(c.Tmp, "shoal-bundle-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	// Written in tmp, which the git may write (with its lock beside it),
	// then moved to path.
	repo, out := filepath.Join(tmp, "repo"), filepath.Join(tmp, "work.bundle")
	g := c.git(tmp)
	objects, err := objectDir(ctx, g, c.Dir)
	if err != nil {
		return 0, err
	}
	format, err := objectFormat(ctx, g, c.Dir)
	if err != nil {
		return 0, err
	}
	n, err := writeBundle(ctx, g, repo, []string{objects}, format, tip, haves, out)
	if err != nil || n == 0 {
		return n, err
	}
	return n, os.Rename(out, path)
}

// maxIndex bounds the index the node copies from an agent's checkout: a
// git index of some hundred thousand files is tens of megabytes.
const maxIndex = 256 << 20

// copyOwnIndex copies the index of checkout dir's own .git directory to
// to, if it has one: opened beneath a .git that is a directory and not a
// link, never through a link, never blocking (a FIFO the agent put
// there), and only a regular file of at most maxIndex bytes.
func copyOwnIndex(dir, to string) error {
	gitDir, err := unix.Open(filepath.Join(dir, ".git"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the checkout's .git is not a directory of its own (%v): the node reads no repository elsewhere", err)
	}
	defer unix.Close(gitDir)
	fd, err := unix.Openat(gitDir, "index", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // no index: git add makes one
	}
	if err != nil {
		return fmt.Errorf("the checkout's .git/index cannot be read as a file (%v)", err)
	}
	f := os.NewFile(uintptr(fd), "index")
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("the checkout's .git/index is not a regular file (%v)", fi.Mode().Type())
	case fi.Size() > maxIndex:
		return fmt.Errorf("the checkout's .git/index is %d bytes, past the %d the node reads", fi.Size(), maxIndex)
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	n, err := io.Copy(out, io.LimitReader(f, maxIndex+1)) // through the disk, not the node's memory
	if err != nil {
		return err
	}
	if n > maxIndex {
		return fmt.Errorf("the checkout's .git/index grew past the %d bytes the node reads", maxIndex)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return keepIndexTime(to, fi)
}

// keepIndexTime gives a copy of an index its original's modification
// time. Git takes an entry changed in the same second as the index was
// written as possibly changed since ("racy") and looks at its content; a
// copy made later would hide an edit made within that second, and the
// edit would be left out of what is taken.
func keepIndexTime(copy string, original os.FileInfo) error {
	return os.Chtimes(copy, time.Time{}, original.ModTime())
}
