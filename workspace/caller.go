package workspace

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A Start is where an agent starts on a caller's repository.
type Start struct {
	Root   string // the top of the caller's work tree
	Repo   string // the repository's identity: its first root commit
	Ref    string // what the caller named (HEAD by default)
	Base   string // the commit Ref names
	Commit string // the commit the agent starts on: Base, or a commit of the uncommitted work on top of it
	// LeftOut says what of the uncommitted work was left out of Commit,
	// and why, a line for each reason.
	LeftOut []string

	git     gitter   // git as the person runs it on their repository (persons)
	objects []string // where that commit's objects are (the caller's, and a temporary directory's)
	format  string   // the hash objects are named by: sha1 or sha256
	scratch string   // the temporary directory to remove, "" when none
}

// Prepare finds the repository dir is in and the commit an agent on it
// starts on: ref's (HEAD when empty), or, withChanges, a commit of the
// tracked and untracked files (not ignored ones) as they are now, on top
// of HEAD. Close removes what it made.
func Prepare(ctx context.Context, dir, ref string, withChanges bool) (*Start, error) {
	if ref == "" {
		ref = "HEAD"
	}
	if withChanges && ref != "HEAD" {
		return nil, fmt.Errorf("--with-changes takes the uncommitted work on top of HEAD; it cannot be given with a ref (%s)", ref)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	switch fi, err := os.Stat(abs); {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("repository %s does not exist", dir)
	case err != nil:
		return nil, fmt.Errorf("repository %s: %v", dir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("repository %s is not a directory", dir)
	}
	env, err := persons(ctx, abs)
	if err != nil {
		return nil, err
	}
	g := gitter{env: env}
	root, err := workTree(ctx, g, abs, dir, ", which has no files to work on: open the agent on a work tree of it (git worktree add DIR)")
	if err != nil {
		return nil, err
	}
	s := &Start{Root: root, Ref: ref, git: g}
	objects, err := objectDir(ctx, g, root)
	if err != nil {
		return nil, err
	}
	s.objects = []string{objects}
	if s.format, err = objectFormat(ctx, g, root); err != nil {
		return nil, fmt.Errorf("repository %s: %v", root, err)
	}
	if s.Base, err = g.line(ctx, root, nil, "rev-parse", "--verify", "--quiet", ref+"^{commit}"); err != nil || s.Base == "" {
		if ref == "HEAD" {
			return nil, fmt.Errorf("repository %s has no commit yet: commit something first", root)
		}
		return nil, fmt.Errorf("%s names no commit in %s", ref, root)
	}
	if shallow, _ := g.line(ctx, root, nil, "rev-parse", "--is-shallow-repository"); shallow == "true" {
		// Its history stops short: git cannot bundle what a node lacks,
		// and its first commit, the repository's identity, is not there.
		return nil, fmt.Errorf("repository %s is a shallow clone, whose history git cannot send whole: run git fetch --unshallow there first, or open the agent on a directory of the node", root)
	}
	if partial := promisor(ctx, g, root); partial != "" {
		// Its history lacks the objects it left on its remote: git
		// cannot bundle them, and would not fetch them for a bundle.
		return nil, fmt.Errorf("repository %s is a partial clone (git clone --filter), whose history lacks objects git cannot send: make it whole there first (git config --unset remote.%[2]s.partialclonefilter && git fetch --refetch %[2]s && git config --unset remote.%[2]s.promisor), or open the agent on a full clone or a directory of the node", root, partial)
	}
	if s.Repo, err = identity(ctx, g, root, s.Base); err != nil {
		return nil, err
	}
	s.Commit = s.Base
	if withChanges {
		if err := s.snapshot(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close removes what Prepare made for the start.
func (s *Start) Close() {
	if s.scratch != "" {
		os.RemoveAll(s.scratch)
	}
}

// snapshot makes the start's commit of the work tree as it is, in a
// temporary object directory (reading the caller's objects) through a
// temporary copy of the caller's index.
func (s *Start) snapshot(ctx context.Context) error {
	tmp, err := os.MkdirTemp("", "shoal-start-")
	if err != nil {
		return err
	}
	s.scratch = tmp
	objects := filepath.Join(tmp, "objects")
	if err := os.MkdirAll(objects, 0o700); err != nil {
		return err
	}
	var extra []string
	// Dated as its base: the same work on the same base is the same
	// commit, whose bundle a node that was sent it once is not sent again.
	if when, err := s.git.line(ctx, s.Root, nil, "show", "-s", "--format=%ct", s.Base); err == nil && when != "" {
		extra = append(extra, "GIT_AUTHOR_DATE=@"+when+" +0000", "GIT_COMMITTER_DATE=@"+when+" +0000")
	}
	commit, left, err := snapshotTree(ctx, s.git, s.Root, s.objects, objects, filepath.Join(tmp, "index"), true, false, s.Base,
		callerWorkSubject+s.Root+", as shoal took it for an agent", "shoal", "shoal@shoal.invalid", extra...)
	if err != nil {
		if strings.Contains(err.Error(), "clean filter") {
			// A filter the repository's own configuration requires
			// (git-crypt's): Shoal's git runs none of its drivers.
			return fmt.Errorf("take the uncommitted work of %s: %v: a filter the repository's own configuration requires is not run by Shoal (a sandboxed agent could have named it); commit those files yourself first, or define the filter in your global git configuration", s.Root, err)
		}
		return fmt.Errorf("take the uncommitted work of %s: %v", s.Root, err)
	}
	s.Commit, s.objects, s.LeftOut = commit, append([]string{objects}, s.objects...), left
	return nil
}

// snapshotTree commits the work tree root (tracked and untracked files,
// not ignored ones) on top of parent, through g, writing objects to
// newObjects and reading existing ones from objects; index is a
// temporary index file, seeded from the repository's own when seed is
// set (else the caller has seeded it); agents says root is an agent's
// checkout on a node. It returns parent when nothing differs from it, and
// what it left out, as its message says it.
func snapshotTree(ctx context.Context, g gitter, root string, objects []string, newObjects, index string, seed, agents bool, parent, message, name, email string, extra ...string) (commit string, left []string, err error) {
	if seed {
		gitDir, err := g.path(ctx, root, nil, "rev-parse", "--absolute-git-dir")
		if err != nil {
			return "", nil, err
		}
		if err := seedIndex(filepath.Join(gitDir, "index"), index); err != nil {
			return "", nil, err
		}
	}
	env := []string{"GIT_INDEX_FILE=" + index, "GIT_OBJECT_DIRECTORY=" + newObjects,
		"GIT_ALTERNATE_OBJECT_DIRECTORIES=" + alternates(objects, ":"),
		"GIT_AUTHOR_NAME=" + name, "GIT_AUTHOR_EMAIL=" + email, "GIT_COMMITTER_NAME=" + name, "GIT_COMMITTER_EMAIL=" + email}
	env = append(env, extra...)
	args := []string{"add", "--all", "--", "."}
	apart, err := nestedRepositories(ctx, g, root, env)
	if err != nil {
		return "", nil, err
	}
	for _, p := range apart {
		args = append(args, ":(exclude,literal)"+p)
	}
	if _, err := g.run(ctx, root, env, nil, args...); err != nil {
		return "", nil, err
	}
	for _, l := range []struct {
		why  string
		dirs []string
	}{
		{"each a git repository of its own, which git keeps apart from this one", apart},
		{"files written into a submodule's directory, which this repository keeps only as a link", writtenUnderLinks(ctx, g, root, env, agents)},
	} {
		if len(l.dirs) > 0 {
			message += leftOut(l.why, l.dirs)
			left = append(left, l.why+": "+strings.Join(l.dirs, "/, ")+"/")
		}
	}
	tree, err := g.line(ctx, root, env, "write-tree")
	if err != nil {
		return "", nil, err
	}
	if old, _ := g.line(ctx, root, env, "rev-parse", parent+"^{tree}"); old == tree {
		return parent, left, nil
	}
	commit, err = g.line(ctx, root, env, "commit-tree", tree, "-p", parent, "-m", message)
	return commit, left, err
}

// leftOut is a paragraph for a snapshot's commit message naming the
// directories dirs left out of it and why; "" when there are none.
func leftOut(why string, dirs []string) string {
	if len(dirs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\nLeft out, " + why + ":\n")
	for _, d := range dirs {
		b.WriteString("  " + d + "/\n")
	}
	return b.String()
}

// persons is what of the person's own git configuration Shoal's gits on
// their repository take, as GIT_CONFIG_* environment: the gits Shoal runs
// read no global or system configuration (a pager, an alias, a hook
// path, a credential helper of the person's have no business there), but
// these settings change what the person's git does with their own files,
// and a snapshot of their work, or a fetch into their repository, must do
// the same:
//
//   - core.excludesFile (by default $XDG_CONFIG_HOME/git/ignore): what
//     their git status never shows (a .env of secrets) is not taken;
//   - core.attributesFile (by default $XDG_CONFIG_HOME/git/attributes),
//     core.autocrlf, core.eol, core.safecrlf: line ends stored as their
//     git add stores them;
//   - filter.<driver>.clean, .process and .required of their global or
//     system configuration: their clean filters (git lfs install's), run
//     on their files as their git add runs them, so a file their
//     attributes send to LFS is stored as its pointer;
//   - safe.directory: a repository they trust that another user owns.
//
// Settings of the repository's own configuration are read by Shoal's gits
// anyway, and given here again after the global ones, so theirs still win;
// but not its filter drivers: a sandboxed agent opened in the repository
// writes its .git/config, and a clean filter named there would run as the
// person when Shoal takes their uncommitted work. A driver the repository
// sets is given as the person's configuration outside it sets it, or as
// none (no clean, no process, not required), and what its attributes send
// to that driver is stored as the file is.
func persons(ctx context.Context, dir string) ([]string, error) {
	keys, values, _, err := personsConfig(ctx, dir)
	return configEnv(keys, values), err
}

// configEnv is the environment giving git the settings keys, with values,
// in their order.
func configEnv(keys, values []string) []string {
	if len(keys) == 0 {
		return nil
	}
	env := []string{fmt.Sprintf("GIT_CONFIG_COUNT=%d", len(keys))}
	for i := range keys {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, keys[i]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, values[i]))
	}
	return env
}

// personsConfig is the settings persons takes, keys and their values in
// the order git reads them.
// excludes is the excludes file the person's own configuration names,
// outside the repository's ("" for none): the file CallerExcludes reads.
// It fails when git cannot tell the person's settings from the
// repository's (a git before 2.26 has no --show-scope): taken for none, the
// repository's own filter drivers would run.
func personsConfig(ctx context.Context, dir string) (keys, values []string, excludes string, err error) {
	// The person's git, as they run it, reads its configuration only.
	cmd := exec.CommandContext(ctx, "git", "config", "--null", "--show-scope", "--get-regexp",
		`^(core\.(excludesfile|attributesfile|autocrlf|eol|safecrlf)|filter\..+\.(clean|process|required)|safe\.directory)$`)
	cmd.Dir = dir
	out, err := cmd.Output()
	exit, ok := errors.AsType[*exec.ExitError](err)
	switch {
	case err == nil, ok && exit.ExitCode() == 1: // 1: none set
	case ok && exit.ExitCode() == 129: // an option it does not know
		return nil, nil, "", fmt.Errorf("git cannot tell your configuration from the repository's in %s (git config --show-scope needs git 2.26 or later): %s", dir, strings.TrimSpace(string(exit.Stderr)))
	case ok:
		return nil, nil, "", fmt.Errorf("git config --show-scope in %s: %v: %s", dir, err, strings.TrimSpace(string(exit.Stderr)))
	default:
		return nil, nil, "", fmt.Errorf("git config in %s: %v", dir, err)
	}
	// Each setting is its scope, then its key and value.
	parts := strings.Split(string(out), "\x00")
	filters := map[string]string{} // the person's value of each filter key, outside the repository
	var repos []string             // the filter keys the repository sets, in order
	for i := 0; i+1 < len(parts); i += 2 {
		scope := parts[i]
		k, v, ok := strings.Cut(parts[i+1], "\n")
		if !ok {
			continue
		}
		own := scope == "local" || scope == "worktree"
		if k == "safe.directory" && own {
			// Git heeds it only where the repository cannot write it;
			// given as ours, it would be heeded.
			continue
		}
		if k == "core.excludesfile" && !own {
			// Only the person's is read by Shoal (CallerExcludes): the
			// file a repository names is its git's to read, not to send
			// to a node, and an agent that could write .git/config
			// could name any file of the person's.
			excludes = homePath(v)
		}
		if strings.HasPrefix(k, "filter.") {
			if own {
				if !slices.Contains(repos, k) {
					repos = append(repos, k)
				}
				continue
			}
			filters[k] = v
		}
		if k == "core.excludesfile" || k == "core.attributesfile" {
			v = homePath(v)
		}
		keys, values = append(keys, k), append(values, v)
	}
	// Last, so they win over the repository's: the person's value of
	// each filter key it sets, or none. A driver the repository requires
	// stays required: with no clean filter run, git refuses to store a
	// file of it (a secret git-crypt keeps encrypted) rather than store
	// it as it is.
	for _, k := range repos {
		v, ok := filters[k]
		if !ok && strings.HasSuffix(k, ".required") {
			continue
		}
		keys, values = append(keys, k), append(values, v)
	}
	for _, d := range []struct{ key, file string }{{"core.excludesfile", "ignore"}, {"core.attributesfile", "attributes"}} {
		if !slices.Contains(keys, d.key) {
			if p := configHome(d.file); p != "" {
				keys, values = append([]string{d.key}, keys...), append([]string{p}, values...)
				if d.key == "core.excludesfile" && excludes == "" {
					excludes = p
				}
			}
		}
	}
	return keys, values, excludes, nil
}

// CallerExcludes are the patterns the person's git ignores in the
// repository at dir beyond its .gitignore files, which travel with it:
// their global excludes file and the repository's info/exclude, without
// comments or blank lines, for a node's snapshot of an agent's work
// (Checkout.Excludes). Past max bytes the rest is not taken, and the
// error says so.
func CallerExcludes(ctx context.Context, dir string, max int) (string, error) {
	var files []string
	keys, values, excludes, err := personsConfig(ctx, dir)
	if err != nil {
		return "", err
	}
	if excludes != "" {
		files = []string{excludes}
	}
	if common, err := (gitter{env: configEnv(keys, values)}).path(ctx, dir, nil, "rev-parse", "--git-common-dir"); err == nil {
		if !filepath.IsAbs(common) {
			common = filepath.Join(dir, common)
		}
		files = append(files, filepath.Join(common, "info", "exclude"))
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // none: nothing to leave out
		}
		for l := range strings.Lines(string(data)) {
			t := strings.TrimSpace(l)
			if t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			l = strings.TrimSuffix(l, "\n") + "\n"
			if b.Len()+len(l) > max {
				return b.String(), fmt.Errorf("the patterns your git ignores in %s (%s) pass %d bytes: those past it are not applied to the agent's work", dir, strings.Join(files, " and "), max)
			}
			b.WriteString(l)
		}
	}
	return b.String(), nil
}

// homePath is path with a leading ~/ taken as the person's home, as git
// reads a path setting.
func homePath(path string) string {
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		if home := os.Getenv("HOME"); home != "" {
			return filepath.Join(home, rest)
		}
	}
	return path
}

// configHome is file in the person's git configuration directory
// ($XDG_CONFIG_HOME/git, by default ~/.config/git), where git looks for
// their global ignore and attributes files when none is set; "" when it
// is not there.
func configHome(file string) string {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := os.Getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	p := filepath.Join(dir, "git", file)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// maxNested bounds the repositories within a work tree that are left out
// of a commit of it by name; past it the rest are found by git, which
// fails on one without a commit and records one with commits as a link
// to a commit it does not have.
const maxNested = 1000

// nestedRepositories lists, relative to root, the untracked directories
// of the work tree at root that are git repositories of their own (an
// agent's git init for a tool, a fixture, a clone), as git finds them
// through the index and environment env: git will not take their files
// into this repository's commit, and fails on one that has no commit
// yet. Git lists such a directory, alone of untracked directories, with a
// trailing slash; it passes over what is ignored, and a directory whose
// files the index tracks is no other repository's to it.
func nestedRepositories(ctx context.Context, g gitter, root string, env []string) ([]string, error) {
	out, err := g.run(ctx, root, env, nil, "ls-files", "-z", "--others", "--exclude-standard")
	if errors.Is(err, ErrTooMuch) {
		return nil, nil // more untracked files than are listed: git's add decides, as before
	}
	if err != nil {
		return nil, err
	}
	var nested []string
	for _, p := range strings.Split(out, "\x00") {
		if strings.HasSuffix(p, "/") && len(nested) < maxNested {
			nested = append(nested, strings.TrimSuffix(p, "/"))
		}
	}
	return nested, nil
}

// writtenUnderLinks lists the submodules of the index env names (links
// to a commit of another repository, which a checkout made on a node
// leaves empty) whose directory under root holds files: what was written
// there cannot come with this repository's commit. In a caller's tree a
// submodule checked out (a repository of its own there) is theirs, as
// usual, and not listed; in an agent's checkout (agents) only the agent
// filled it (git submodule update), and its work there is listed too.
func writtenUnderLinks(ctx context.Context, g gitter, root string, env []string, agents bool) []string {
	out, err := g.run(ctx, root, env, nil, "ls-files", "--stage", "-z")
	if err != nil {
		return nil
	}
	var written []string
	for _, e := range strings.Split(out, "\x00") {
		meta, path, ok := strings.Cut(e, "\t")
		if !ok || !strings.HasPrefix(meta, "160000 ") {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(path))
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil && !agents {
			continue // checked out: a repository of its own
		}
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 && len(written) < maxNested {
			written = append(written, path)
		}
	}
	return written
}

// seedIndex copies the repository's index, own, to index, with its
// modification time (keepIndexTime); a repository without one leaves
// index unmade.
func seedIndex(own, index string) error {
	f, err := os.Open(own)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat() // the time of what is read: a rewrite is a file of its own
	if err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	if err := os.WriteFile(index, b, 0o600); err != nil {
		return err
	}
	return keepIndexTime(index, fi)
}

// objectDir is the object directory of the repository whose work tree is
// root.
func objectDir(ctx context.Context, g gitter, root string) (string, error) {
	d, err := g.path(ctx, root, nil, "rev-parse", "--git-path", "objects")
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(d) {
		d = filepath.Join(root, d)
	}
	return d, nil
}

// identity is a repository's identity: the first (by name) root commit of
// what commit descends from. Clones share it, whatever their remotes.
func identity(ctx context.Context, g gitter, dir, commit string) (string, error) {
	out, err := g.run(ctx, dir, nil, nil, "rev-list", "--max-parents=0", commit)
	if err != nil {
		return "", err
	}
	roots := strings.Fields(out)
	if len(roots) == 0 {
		return "", fmt.Errorf("commit %s has no root commit", commit)
	}
	slices.Sort(roots)
	return roots[0], nil
}

// Largest names the n largest files the start's commit of the caller's
// uncommitted work adds or changes, each with its size in bytes, largest
// first; none when the start is a commit of theirs.
func (s *Start) Largest(ctx context.Context, n int) ([]string, []int64, error) {
	if s.Commit == s.Base {
		return nil, nil, nil
	}
	env := []string{"GIT_OBJECT_DIRECTORY=" + s.objects[0], "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + alternates(s.objects[1:], ":")}
	out, err := s.git.run(ctx, s.Root, env, nil, "diff-tree", "-r", "-z", "--no-renames", "--diff-filter=AMT", s.Base, s.Commit)
	if err != nil {
		return nil, nil, err
	}
	// Each change is ":<modes> <old> <new> <status>", then its path.
	fields := strings.Split(strings.TrimSuffix(out, "\x00"), "\x00")
	var paths, blobs []string
	for i := 0; i+1 < len(fields); i += 2 {
		meta := strings.Fields(fields[i])
		if len(meta) == 5 && strings.HasPrefix(meta[1], "100") { // files, not links or submodules
			paths, blobs = append(paths, fields[i+1]), append(blobs, meta[3])
		}
	}
	if len(blobs) == 0 {
		return nil, nil, nil
	}
	sizes, err := s.git.run(ctx, s.Root, env, []byte(strings.Join(blobs, "\n")+"\n"), "cat-file", "--batch-check=%(objectsize)")
	if err != nil {
		return nil, nil, err
	}
	size := make([]int64, len(paths))
	for i, l := range strings.Fields(sizes) {
		if i < len(size) {
			size[i], _ = strconv.ParseInt(l, 10, 64)
		}
	}
	order := make([]int, len(paths))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(size[b], size[a]) })
	order = order[:min(n, len(order))]
	names, bytes := make([]string, len(order)), make([]int64, len(order))
	for i, k := range order {
		names[i], bytes[i] = paths[k], size[k]
	}
	return names, bytes, nil
}

// Bundle writes to path a bundle of what the node lacks of the start's
// commit, given the commits the node has (haves; those the caller does
// not know are left out). It returns how many commits it holds.
func (s *Start) Bundle(ctx context.Context, haves []string, path string) (int, error) {
	tmp, err := os.MkdirTemp("", "shoal-bundle-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	return writeBundle(ctx, s.git, tmp, s.objects, s.format, s.Commit, haves, path)
}

// Land puts the agent's work, a bundle of the commit tip made by the node,
// on branch in the caller's repository at dir (created, or moved to tip),
// without touching the caller's checkout; a branch checked out is
// refused, and so is a move that leaves behind commits of the agent's
// unless force (moveBranch).
func Land(ctx context.Context, dir, bundle, tip, branch string, force bool) error {
	if !IsCommitID(tip) {
		return fmt.Errorf("the node named no commit (%q)", tip)
	}
	env, err := persons(ctx, dir)
	if err != nil {
		return err
	}
	g := gitter{env: env}
	root, err := workTree(ctx, g, dir, dir, ": fetch --into a work tree of it (git worktree add DIR)")
	if err != nil {
		return err
	}
	if cur, _ := g.line(ctx, root, nil, "symbolic-ref", "--quiet", "HEAD"); cur == "refs/heads/"+branch {
		return fmt.Errorf("branch %s is checked out in %s: switch to another branch first, or fetch --into another repository", branch, root)
	}
	// What the node sent is fetched only as a bundle: git takes any other
	// file for the path of a repository (a one-line "gitdir: …" file
	// names any on this machine).
	h, err := readBundleHeader(bundle)
	if err != nil {
		return fmt.Errorf("what the node sent as the agent's work: %v", err)
	}
	if err := holdsPrerequisites(ctx, g, root, h.prerequisites); err != nil {
		return err
	}
	// Taken under a ref of its own first, so the branch moves only once
	// nothing of the caller's on it would be lost.
	// Named for this landing alone: two agents' work may be the same
	// commit (both started on the same uncommitted work and changed
	// nothing), landed at once, and each removes its ref when done.
	incoming := "refs/shoal-incoming/" + tip + "-" + rand.Text()
	if _, err := g.run(ctx, root, nil, nil, fetchArgs(bundle, "+"+bundleRef+":"+incoming)...); err != nil {
		return err
	}
	defer g.run(context.WithoutCancel(ctx), root, nil, nil, "update-ref", "-d", incoming)
	got, err := g.line(ctx, root, nil, "rev-parse", "--verify", incoming)
	if err != nil || got != tip {
		return fmt.Errorf("the bundle's commit is %s, not the agent's %s", got, tip)
	}
	return moveBranch(ctx, g, root, branch, tip, force)
}

// holdsPrerequisites says which of ids, the commits the agent's work builds
// on, the repository at root lacks (git's fetch says only "Repository lacks
// these prerequisite commits"): a clone behind, or another repository.
func holdsPrerequisites(ctx context.Context, g gitter, root string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	out, err := g.run(ctx, root, nil, []byte(strings.Join(ids, "\n")+"\n"), "cat-file", "--batch-check")
	if err != nil {
		return err
	}
	var missing []string
	for l := range strings.Lines(out) {
		if id, ok := strings.CutSuffix(strings.TrimSpace(l), " missing"); ok {
			missing = append(missing, id[:min(len(id), 12)])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	what := "commit"
	if len(missing) > 1 {
		what = "commits"
	}
	return &LacksError{fmt.Sprintf("%s lacks %s %s, which the agent's work builds on (what it started on): fetch it into that repository first (git fetch), or fetch the agent's work --into the repository it was opened on", root, what, strings.Join(missing, ", "))}
}

// LacksError is Land's refusal of a bundle whose prerequisites, the
// commits the agent's work builds on, the repository lacks: a bundle of
// the work's whole history lands there.
type LacksError struct{ msg string }

func (e *LacksError) Error() string { return e.msg }

// underWay says what a work tree of the repository at root is doing to
// branch ("rebased", "bisected"), as git's own check of a branch in use
// reads it; "" when nothing is. A branch under a rebase (the one rebased,
// or one a rebase --update-refs will set) is not listed as checked out,
// but the rebase moves it when it ends.
func underWay(ctx context.Context, g gitter, root, branch string) string {
	common, err := g.path(ctx, root, nil, "rev-parse", "--git-common-dir")
	if err != nil {
		return ""
	}
	if !filepath.IsAbs(common) {
		common = filepath.Join(root, common)
	}
	dirs := []string{common}
	linked, _ := filepath.Glob(filepath.Join(common, "worktrees", "*"))
	dirs = append(dirs, linked...)
	ref := "refs/heads/" + branch
	for _, d := range dirs {
		for _, f := range []string{"rebase-merge/head-name", "rebase-apply/head-name"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil && strings.TrimSpace(string(b)) == ref {
				return "rebased"
			}
		}
		// A rebase --update-refs sets each branch it lists when it ends
		// (lines in threes: the ref, its commit before, after).
		if b, err := os.ReadFile(filepath.Join(d, "rebase-merge", "update-refs")); err == nil {
			lines := strings.Split(string(b), "\n")
			for i := 0; i < len(lines); i += 3 {
				if strings.TrimSpace(lines[i]) == ref {
					return "rebased"
				}
			}
		}
		if b, err := os.ReadFile(filepath.Join(d, "BISECT_START")); err == nil {
			if name := strings.TrimSpace(string(b)); name == branch || name == ref {
				return "bisected"
			}
		}
	}
	return ""
}

// moveBranch puts branch at tip in the repository at root. It refuses
// when the branch holds commits tip does not that Shoal did not make (a
// person's, or an agent's commit a person amended: git keeps its author),
// and, unless force, work of the agent's that a fetch brought before and
// tip no longer holds: its own commits (the agent rewrote its history, or
// its checkout was lost and it began anew on a reopen), and what of its
// uncommitted work the node committed for a fetch (SnapshotMessage) that
// tip no longer holds (notHeld); each names them. A commit of the node's
// whose work tip holds still, changed or committed by the agent since,
// is left behind, as each fetch makes it anew; so is what Shoal made of
// the caller's uncommitted work the agent started on, which is the
// caller's, and which the agent may amend. The branch moves only from the
// commit checked, and its reflog says so.
func moveBranch(ctx context.Context, g gitter, root, branch, tip string, force bool) error {
	ref := "refs/heads/" + branch
	trees, err := g.run(ctx, root, nil, nil, "worktree", "list", "--porcelain")
	if err != nil {
		return err
	}
	for l := range strings.Lines(trees) {
		if strings.TrimSpace(l) == "branch "+ref {
			return fmt.Errorf("branch %s is checked out in a work tree of %s: switch it to another branch first, or fetch --into another repository", branch, root)
		}
	}
	if what := underWay(ctx, g, root, branch); what != "" {
		return fmt.Errorf("branch %s is being %s in %s: finish or abort that first, or fetch --into another repository", branch, what, root)
	}
	old, _ := g.line(ctx, root, nil, "rev-parse", "--verify", "--quiet", ref)
	dropped, undone := 0, 0
	if old != "" {
		// Read as git prints it, a line a commit, each field cut short
		// (an email from its left, keeping its domain): the node made
		// these commits, and a message compresses a thousandfold.
		var yours, agents, snapshots []string
		nYours, unread := 0, 0
		err := g.scan(ctx, root, func(l string) {
			f := strings.Split(l, "\x00")
			if len(f) != 4 {
				return
			}
			for i := range f {
				f[i] = strings.TrimSpace(f[i])
			}
			named := strings.TrimSpace(f[0][:min(12, len(f[0]))] + " " + f[3])
			switch {
			case !strings.HasSuffix(f[1], "@shoal.invalid") || !strings.HasSuffix(f[2], "@shoal.invalid"):
				if nYours++; len(yours) < 3 {
					yours = append(yours, named)
				}
			case strings.HasPrefix(f[3], snapshotSubject):
				if len(snapshots) < maxSnapshotsRead {
					snapshots = append(snapshots, f[0])
				} else {
					unread++
				}
			case isSnapshot(f[3]):
			default:
				if dropped++; len(agents) < 3 {
					agents = append(agents, named)
				}
			}
		}, "log", "--format=%H%x00%<(100,ltrunc)%ae%x00%<(100,ltrunc)%ce%x00%<(72,trunc)%s", tip+".."+old)
		if err != nil {
			return err
		}
		if nYours > 0 {
			return fmt.Errorf("branch %s has %s the agent's work does not hold, not made by Shoal (%s): move them to a branch of your own, or delete %s, and fetch again",
				branch, count(nYours, "commit", "commits"), strings.Join(yours, "; "), branch)
		}
		var lost []string
		for _, s := range snapshots {
			files, n, err := notHeld(ctx, g, root, s, tip)
			if err != nil {
				return err
			}
			if n == 0 {
				continue
			}
			if undone++; len(lost) < 3 {
				lost = append(lost, fmt.Sprintf("%.12s, %s", s, files))
			}
		}
		if undone += unread; unread > 0 && len(lost) < 3 {
			lost = append(lost, fmt.Sprintf("%d more, not compared", unread))
		}
		if (dropped > 0 || undone > 0) && !force {
			var what []string
			if dropped > 0 {
				what = append(what, fmt.Sprintf("%d of the agent's commits that its work no longer holds (%s)", dropped, strings.Join(agents, "; ")))
			}
			if undone > 0 {
				what = append(what, fmt.Sprintf("the agent's uncommitted work a fetch brought before, which its work no longer holds (%s)", strings.Join(lost, "; ")))
			}
			return fmt.Errorf("branch %s has %s: the agent rewrote its history or undid its changes, or its checkout was lost and it began anew. Nothing was moved; fetch again with --force to move %s to the agent's work anyway (git's reflog keeps where it was), or --into another repository",
				branch, strings.Join(what, ", and "), branch)
		}
	}
	why := "shoal fetch: the agent's work"
	switch {
	case dropped > 0 && undone > 0:
		why = fmt.Sprintf("shoal fetch --force: the agent's work, leaving %d of its commits and its uncommitted work fetched before", dropped)
	case dropped > 0:
		why = fmt.Sprintf("shoal fetch --force: the agent's work, leaving %d of its commits fetched before", dropped)
	case undone > 0:
		why = "shoal fetch --force: the agent's work, leaving its uncommitted work fetched before"
	}
	if _, err := g.run(ctx, root, nil, nil, "update-ref", "-m", why, ref, tip, old); err != nil {
		if dir, _, ok := strings.Cut(branch, "/"); ok && strings.Contains(err.Error(), "exists; cannot create") {
			// A branch named as the directory of branch's name.
			return fmt.Errorf("branch %s cannot be made in %s: a branch %s is there, and git keeps a branch's name from being another's directory; rename it (git branch -m %s NEW), or fetch --into another repository", branch, root, dir, dir)
		}
		return err
	}
	got, err := g.line(ctx, root, nil, "rev-parse", "--verify", ref)
	if err != nil || got != tip {
		return fmt.Errorf("branch %s is at %s after the fetch, not the agent's %s", branch, got, tip)
	}
	return nil
}

// BranchBlocked says why branch cannot be made in the start's repository
// (nil when it can): a branch named as the directory of its name is
// there (a branch shoal blocks shoal/<id>). A job checks it before its
// turns, which it would otherwise run for work it could not land.
func (s *Start) BranchBlocked(ctx context.Context, branch string) error {
	d, _, ok := strings.Cut(branch, "/")
	if !ok {
		return nil
	}
	if got, _ := s.git.line(ctx, s.Root, nil, "rev-parse", "--verify", "--quiet", "refs/heads/"+d); got == "" {
		return nil
	}
	return fmt.Errorf("branch %s cannot be made in %s: a branch %s is there, and git keeps a branch's name from being another's directory; rename it (git branch -m %s NEW) first", branch, s.Root, d, d)
}

// maxSnapshotsRead bounds the node's commits of uncommitted work a move
// compares with the agent's work (notHeld): a branch holds one, or one
// more for each node the agent was carried to; past it each counts as
// work the agent's no longer holds.
const maxSnapshotsRead = 16

// notHeld compares commit snapshot, the node's of an agent's uncommitted
// work, with tip, the agent's work now: the files snapshot changed that
// tip has again as they were before it (the agent undid or dropped that
// work, or began anew) are work tip no longer holds. It returns how many
// there are, and says which (the first few by name); a file tip has as
// snapshot has it, or changed further, is held. A snapshot whose changes
// are past what is read is counted as not held.
func notHeld(ctx context.Context, g gitter, root, snapshot, tip string) (string, int, error) {
	unread := "its files not compared"
	parent, err := g.line(ctx, root, nil, "rev-parse", "--verify", "--quiet", snapshot+"^1")
	if err != nil || parent == "" {
		return unread, 1, nil // made on nothing: no commit of the node's
	}
	g.max = MaxOutput
	names := func(to string) ([]string, error) {
		out, err := g.run(ctx, root, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--name-only", parent, to)
		return strings.Split(strings.TrimSuffix(out, "\x00"), "\x00"), err
	}
	made, err := names(snapshot)
	if errors.Is(err, ErrTooMuch) {
		return unread, 1, nil
	}
	if err != nil {
		return "", 0, err
	}
	still, err := names(tip)
	if errors.Is(err, ErrTooMuch) {
		return unread, 1, nil
	}
	if err != nil {
		return "", 0, err
	}
	changed := make(map[string]bool, len(still))
	for _, p := range still {
		changed[p] = true
	}
	var gone []string
	n := 0
	for _, p := range made {
		if p == "" || changed[p] {
			continue
		}
		if n++; len(gone) < 3 {
			gone = append(gone, strconv.Quote(p))
		}
	}
	if n > len(gone) {
		gone = append(gone, fmt.Sprintf("%d more", n-len(gone)))
	}
	return "with its changes to " + strings.Join(gone, ", "), n, nil
}

// count is n with the noun for one or for more.
func count(n int, one, more string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, more)
}

// SnapshotMessage is the message of the commit a node makes of an agent's
// uncommitted work for a fetch: a later fetch leaves it behind.
func SnapshotMessage(agent, node string, turn int) string {
	return fmt.Sprintf("%s%s not committed by it (as of turn %d)\n\nAgent: %s\nNode: %s\nTurn: %d\n", snapshotSubject, agent, turn, agent, node, turn)
}

// The subjects of what Shoal commits of uncommitted work: the node's of
// an agent's (SnapshotMessage), and the caller's it opened an agent on
// (which the agent may amend into a commit of its own).
const (
	snapshotSubject   = "shoal: work of agent "
	callerWorkSubject = "Uncommitted work of "
)

// isSnapshot reports whether subject is that of a commit Shoal made of
// uncommitted work.
func isSnapshot(subject string) bool {
	return strings.HasPrefix(subject, snapshotSubject) || strings.HasPrefix(subject, callerWorkSubject)
}

// SetBranch puts branch at commit in the caller's repository at dir, for
// an agent whose work is the commit it started on; dir must have it. It
// moves as Land moves it.
func SetBranch(ctx context.Context, dir, branch, commit string, force bool) error {
	env, err := persons(ctx, dir)
	if err != nil {
		return err
	}
	g := gitter{env: env}
	root, err := workTree(ctx, g, dir, dir, ": fetch --into a work tree of it (git worktree add DIR)")
	if err != nil {
		return err
	}
	if cur, _ := g.line(ctx, root, nil, "symbolic-ref", "--quiet", "HEAD"); cur == "refs/heads/"+branch {
		return fmt.Errorf("branch %s is checked out in %s: switch to another branch first", branch, root)
	}
	return moveBranch(ctx, g, root, branch, commit, force)
}

// promisor names the remote a partial clone (git clone --filter) leaves
// the rest of its objects on, or "" for a whole repository: git records
// it as extensions.partialClone, or as remote.<name>.promisor.
func promisor(ctx context.Context, g gitter, root string) string {
	if name, _ := g.line(ctx, root, nil, "config", "--get", "extensions.partialClone"); name != "" {
		return name
	}
	out, _ := g.run(ctx, root, nil, nil, "config", "--get-regexp", `^remote\..*\.promisor$`)
	for line := range strings.Lines(out) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		if b, err := strconv.ParseBool(value); err == nil && b {
			return strings.TrimSuffix(strings.TrimPrefix(key, "remote."), ".promisor")
		}
	}
	return ""
}

// workTree is the top of the git work tree dir is in, or why there is
// none: git missing (ErrNoGit), no repository, or a bare one, whose
// refusal bare ends (what to do). named is dir as the caller named it.
func workTree(ctx context.Context, g gitter, dir, named, bare string) (string, error) {
	root, err := g.path(ctx, dir, nil, "rev-parse", "--show-toplevel")
	switch {
	case err == nil:
		return root, nil
	case errors.Is(err, ErrNoGit):
		return "", err
	}
	if is, _ := g.line(ctx, dir, nil, "rev-parse", "--is-bare-repository"); is == "true" {
		return "", fmt.Errorf("%s is a bare repository%s", named, bare)
	}
	return "", fmt.Errorf("%s is not in a git work tree: %v", named, err)
}
