package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// plantTraps writes into the configuration of the repository at repo
// every setting that has git run a program (as a sandboxed agent opened
// in that directory can: it writes .git), each program recording its
// name in the directory it returns.
func plantTraps(t *testing.T, repo string) string {
	t.Helper()
	ran := t.TempDir()
	programs := t.TempDir()
	trap := func(name string) string {
		p := filepath.Join(programs, name)
		write(t, p, "#!/bin/sh\ntouch '"+filepath.Join(ran, name)+"'\ncat\n")
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hooks := filepath.Join(repo, ".hooks")
	for _, h := range []string{"pre-commit", "post-commit", "post-checkout", "reference-transaction", "pre-auto-gc", "post-index-change", "fsmonitor-watchman"} {
		write(t, filepath.Join(hooks, h), "#!/bin/sh\ntouch '"+filepath.Join(ran, "hook-"+h)+"'\n")
		os.Chmod(filepath.Join(hooks, h), 0o755)
		write(t, filepath.Join(repo, ".git", "hooks", h), "#!/bin/sh\ntouch '"+filepath.Join(ran, "githooks-"+h)+"'\n")
		os.Chmod(filepath.Join(repo, ".git", "hooks", h), 0o755)
	}
	included := filepath.Join(programs, "included")
	write(t, included, "[core]\n\tfsmonitor = "+trap("included-fsmonitor")+"\n")
	for _, kv := range [][2]string{
		{"core.fsmonitor", trap("fsmonitor")},
		{"core.hooksPath", hooks},
		{"diff.external", trap("diff.external")},
		{"core.pager", trap("core.pager")},
		{"pager.log", trap("pager.log")},
		{"filter.x.clean", trap("filter.clean")},
		{"filter.x.smudge", trap("filter.smudge")},
		{"filter.y.process", trap("filter.process")},
		{"diff.x.textconv", trap("textconv")},
		{"diff.x.command", trap("diff.command")},
		{"merge.x.driver", trap("merge.driver")},
		{"gpg.program", trap("gpg.program")},
		{"log.showSignature", "true"},
		{"commit.gpgSign", "true"},
		{"core.alternateRefsCommand", trap("alternateRefsCommand")},
		{"core.sshCommand", trap("sshCommand")},
		{"uploadpack.packObjectsHook", trap("packObjectsHook")},
		{"core.editor", trap("editor")},
		{"credential.helper", "!" + trap("credential.helper")},
		{"alias.log", "!" + trap("alias.log")},
		{"gc.auto", "1"},
		{"maintenance.auto", "true"},
		{"include.path", included},
	} {
		git(t, repo, "config", kv[0], kv[1])
	}
	write(t, filepath.Join(repo, ".gitattributes"), "*.txt filter=x diff=x merge=x\n*.dat filter=y\n")
	return ran
}

// startFile is the content of path in the start's commit.
func startFile(t *testing.T, s *Start, path string) string {
	t.Helper()
	env := []string{"GIT_OBJECT_DIRECTORY=" + s.objects[0], "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + alternates(s.objects[1:], ":")}
	out, err := run(context.Background(), s.Root, env, nil, "cat-file", "-p", s.Commit+":"+path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ranAny lists what of the planted programs ran.
func ranAny(t *testing.T, ran string) []string {
	t.Helper()
	ents, err := os.ReadDir(ran)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A sandboxed agent opened in a person's repository writes its
// .git/config; Shoal's gits on that repository (the open --with-changes,
// the bundle, the landing of an agent's work) ran what it named there as
// the person, outside any sandbox: an outside review had `shoal open
// --repo DIR --with-changes` run a planted core.fsmonitor. None of what
// the repository's configuration names runs now, whatever git does for
// Shoal: no fsmonitor, no hook, no filter the repository alone defines,
// no signature check, no alternate refs command.
func TestCallerGitsRunNothingTheRepositoryConfigures(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	ctx := context.Background()
	repo := newRepo(t)
	ran := plantTraps(t, repo)
	// HEAD signed (log.showSignature runs gpg.program on it), and the
	// repository borrowing another's objects (a fetch asks
	// core.alternateRefsCommand for the other's refs).
	other := newRepo(t)
	write(t, filepath.Join(repo, ".git", "objects", "info", "alternates"), filepath.Join(other, ".git", "objects")+"\n")
	head := git(t, repo, "rev-parse", "HEAD")
	signed := "tree " + git(t, repo, "rev-parse", "HEAD^{tree}") + "\nparent " + head +
		"\nauthor a <a1@shoal.invalid> 1700000000 +0000\ncommitter a <a1@shoal.invalid> 1700000000 +0000\n" +
		"gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n\nsigned\n"
	cmd := exec.Command("git", "hash-object", "-t", "commit", "-w", "--stdin")
	cmd.Dir, cmd.Stdin = repo, strings.NewReader(signed)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	signedID := strings.TrimSpace(string(out))
	if err := os.WriteFile(filepath.Join(repo, ".git", "refs", "heads", "main"), []byte(signedID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(repo, "a.txt"), "edited\n")
	write(t, filepath.Join(repo, "new.txt"), "new\n")
	write(t, filepath.Join(repo, "b.dat"), "data\n")
	if got := ranAny(t, ran); len(got) > 0 {
		t.Fatalf("the test's own git ran %v", got)
	}

	s, err := Prepare(ctx, repo, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Commit == s.Base {
		t.Fatal("the start took no uncommitted work")
	}
	if _, _, err := s.Largest(ctx, 3); err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(t.TempDir(), "b")
	if _, err := s.Bundle(ctx, nil, b); err != nil {
		t.Fatal(err)
	}
	if _, err := CallerExcludes(ctx, repo, 1<<10); err != nil {
		t.Fatal(err)
	}
	if got := ranAny(t, ran); len(got) > 0 {
		t.Errorf("the start --with-changes and its bundle ran %v", got)
	}
	// What the repository's own filter would have stored is stored as
	// the file is.
	for _, p := range []string{"a.txt", "new.txt", "b.dat"} {
		want, _ := os.ReadFile(filepath.Join(repo, p))
		if got := startFile(t, s, p); got != string(want) {
			t.Errorf("the start stored %s as %q, not %q", p, got, want)
		}
	}

	co, tip := agentWork(t, s, b)
	wb := filepath.Join(t.TempDir(), "w")
	if _, err := co.BundleWork(ctx, tip, []string{signedID}, wb); err != nil {
		t.Fatal(err)
	}
	// The branch first at the signed commit (a fetch's log reads it).
	if err := SetBranch(ctx, repo, "shoal/a1", signedID, false); err != nil {
		t.Fatal(err)
	}
	if err := Land(ctx, repo, wb, tip, "shoal/a1", true); err != nil {
		t.Fatal(err)
	}
	if got := git(t, repo, "rev-parse", "shoal/a1"); got != tip {
		t.Fatalf("shoal/a1 is at %s, not the agent's %s", got, tip)
	}
	if got := ranAny(t, ran); len(got) > 0 {
		t.Errorf("the start, its bundle and the landing of the agent's work ran %v", got)
	}
}

// A person's own filter (their global configuration's: git lfs install)
// still cleans their files in a start --with-changes, even when the
// repository's configuration names another program for the same driver.
func TestCallerGitsRunThePersonsFilterNotTheRepositorys(t *testing.T) {
	home := t.TempDir()
	ran := t.TempDir()
	person := filepath.Join(home, "clean")
	write(t, person, "#!/bin/sh\ntouch '"+filepath.Join(ran, "person")+"'\ntr a-z A-Z\n")
	planted := filepath.Join(home, "planted")
	write(t, planted, "#!/bin/sh\ntouch '"+filepath.Join(ran, "planted")+"'\ncat\n")
	os.Chmod(person, 0o755)
	os.Chmod(planted, 0o755)
	write(t, filepath.Join(home, ".gitconfig"), "[filter \"up\"]\n\tclean = "+person+"\n")
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	repo := newRepo(t)
	git(t, repo, "config", "filter.up.clean", planted)
	write(t, filepath.Join(repo, ".gitattributes"), "*.up filter=up\n")
	write(t, filepath.Join(repo, "x.up"), "shout\n")
	s, err := Prepare(context.Background(), repo, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := startFile(t, s, "x.up"); got != "SHOUT\n" {
		t.Errorf("x.up stored as %q, not as the person's filter cleans it", got)
	}
	if got := ranAny(t, ran); !slices.Equal(got, []string{"person"}) {
		t.Errorf("the filters that ran: %v; want the person's alone", got)
	}
}

// The patterns sent to the node as the person's ignores come from their
// own configuration (and the repository's info/exclude), never from a
// file the repository's configuration names: a sandboxed agent that
// wrote core.excludesFile = <a secret of the person's> into .git/config
// had its lines sent to the node, into the next agent's checkout.
func TestCallerExcludesReadNoFileTheRepositoryNames(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"commit", "-q", "--allow-empty", "-m", "one"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	secret := filepath.Join(t.TempDir(), "id_key")
	write(t, secret, "SECRET-KEY-LINE\n")
	cmd := exec.Command("git", "config", "core.excludesFile", secret)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git config: %v %s", err, out)
	}
	write(t, filepath.Join(repo, ".git", "info", "exclude"), "*.log\n")
	got, err := CallerExcludes(context.Background(), repo, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, "SECRET") {
		t.Errorf("the patterns sent to the node hold the lines of the file the repository's configuration names:\n%s", got)
	}
	if !strings.Contains(got, "*.log") {
		t.Errorf("the patterns sent to the node lack the repository's info/exclude:\n%s", got)
	}
}

// agentWork is agent a1's checkout on a node of the start s, whose bundle
// is b, with a file of the agent's committed by the node: the checkout
// and the commit.
func agentWork(t *testing.T, s *Start, b string) (Checkout, string) {
	t.Helper()
	ctx := context.Background()
	cache := &Cache{Dir: t.TempDir()}
	if err := cache.Receive(ctx, s.Repo, b, s.Commit); err != nil {
		t.Fatal(err)
	}
	co := Checkout{Dir: filepath.Join(t.TempDir(), "a1")}
	if err := cache.CheckoutBundle(ctx, s.Repo, b, s.Commit, co.Dir, "shoal/a1", "shoal agent a1", "a1@shoal.invalid"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(co.Dir, "work.txt"), "the agent's\n")
	tip, err := co.Snapshot(ctx, SnapshotMessage("a1", "n1", 1), "shoal agent a1", "a1@shoal.invalid")
	if err != nil {
		t.Fatal(err)
	}
	return co, tip
}
