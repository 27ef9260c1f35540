package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A repository's url.<base>.insteadOf could turn the path of the bundle a
// fetch lands into an ssh:// URL, and git would run the repository's
// core.sshCommand as the person, outside any sandbox (a sandboxed agent
// opened in the directory writes .git/config; the bundle's directory has
// a prefix it can guess). Shoal's gits reach no network: nothing runs,
// the fetch fails. An outside reader found the trap run.
func TestLandRunsNoSSHCommandViaInsteadOf(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	ctx := context.Background()
	repo := newRepo(t)
	ran := t.TempDir()
	trap := filepath.Join(t.TempDir(), "trap")
	write(t, trap, "#!/bin/sh\ntouch '"+filepath.Join(ran, "sshCommand")+"'\nexit 1\n")
	os.Chmod(trap, 0o755)

	// The agent's work, made as the test in caller_traps_test.go makes it.
	s, err := Prepare(ctx, repo, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := filepath.Join(t.TempDir(), "b")
	if _, err := s.Bundle(ctx, nil, b); err != nil {
		t.Fatal(err)
	}
	co, tip := agentWork(t, s, b)
	wdir := t.TempDir()
	wb := filepath.Join(wdir, "shoal-work-123")
	if _, err := co.BundleWork(ctx, tip, []string{s.Commit}, wb); err != nil {
		t.Fatal(err)
	}

	// What the agent plants in .git/config.
	git(t, repo, "config", "url.ssh://agent.invalid/x.insteadOf", wdir+"/")
	git(t, repo, "config", "core.sshCommand", trap)

	_ = Land(ctx, repo, wb, tip, "shoal/a1", false) // fails or not: what matters is what ran
	if _, err := os.Stat(filepath.Join(ran, "sshCommand")); err == nil {
		t.Errorf("Land's fetch ran the repository's core.sshCommand (reached through url.insteadOf rewriting the bundle's path)")
	}
}

// A repository that names its own excludes file keeps it in Shoal's gits:
// only the file Shoal reads and sends to the node is the person's alone.
// Dropping the repository's setting had the person's global file given
// over it, and a file their own git status ignores went into the start
// (an outside reader found it).
func TestStartHonoursTheRepositorysOwnExcludesFile(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	write(t, filepath.Join(home, ".config", "git", "ignore"), ".DS_Store\n")
	ctx := context.Background()
	repo := newRepo(t)
	mine := filepath.Join(repo, ".git", "my-ignores")
	write(t, mine, "secrets.env\n")
	git(t, repo, "config", "core.excludesFile", mine)
	write(t, filepath.Join(repo, "secrets.env"), "API_KEY=hunter2\n")
	write(t, filepath.Join(repo, "new.txt"), "new\n")

	// The person's own git does not see secrets.env.
	cmd := exec.Command("git", "status", "--porcelain", "--untracked-files=all")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); got != "?? new.txt\n" {
		t.Fatalf("the person's git status: %q", got)
	}

	s, err := Prepare(ctx, repo, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	env := []string{"GIT_OBJECT_DIRECTORY=" + s.objects[0], "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + alternates(s.objects[1:], ":")}
	names, err := run(ctx, s.Root, env, nil, "ls-tree", "-r", "--name-only", s.Commit)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range splitLines(names) {
		if n == "secrets.env" {
			t.Errorf("the start --with-changes took secrets.env, which the person's git ignores (core.excludesFile in .git/config): it goes to the node")
		}
	}
}

// A filter the repository's own configuration requires (git-crypt's,
// written into .git/config by git-crypt unlock) is not run by Shoal, and a
// changed file of it is not stored as it is either: the start is refused.
// Here the "encryption" is rot13. An outside reader found the plaintext
// stored and sent to the node.
func TestStartStoresNoPlaintextOfARepositoryFilter(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	ctx := context.Background()
	repo := newRepo(t)
	enc := filepath.Join(t.TempDir(), "enc")
	write(t, enc, "#!/bin/sh\ntr a-zA-Z n-za-mN-ZA-M\n")
	os.Chmod(enc, 0o755)
	git(t, repo, "config", "filter.crypt.clean", enc)
	git(t, repo, "config", "filter.crypt.smudge", enc)
	git(t, repo, "config", "filter.crypt.required", "true")
	write(t, filepath.Join(repo, ".gitattributes"), "secret.txt filter=crypt\n")
	write(t, filepath.Join(repo, "secret.txt"), "password one\n")
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "secret")
	if got := git(t, repo, "cat-file", "-p", "HEAD:secret.txt"); got != "cnffjbeq bar" {
		t.Fatalf("the person's commit stored %q", got)
	}
	write(t, filepath.Join(repo, "secret.txt"), "password two\n")

	s, err := Prepare(ctx, repo, "", true)
	if err != nil {
		if !strings.Contains(err.Error(), "a filter the repository's own configuration requires is not run by Shoal") {
			t.Errorf("the refusal does not say why: %v", err)
		}
		return
	}
	defer s.Close()
	t.Errorf("the start --with-changes went on past a filter the repository requires and Shoal does not run")
	if got := startFile(t, s, "secret.txt"); got == "password two\n" {
		t.Errorf("the start --with-changes stored secret.txt as plaintext %q (the repository's clean filter, required=true, was switched off): it goes to the node", got)
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// A git that cannot say which configuration a setting comes from (no
// --show-scope before git 2.26) cannot have the repository's filter
// drivers told from the person's: the start is refused, saying so, and
// nothing the repository names runs. Here a wrapper git refuses
// --show-scope as git 2.25 does.
func TestStartRefusedWhenGitCannotTellScopes(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("no git on PATH")
	}
	bin := t.TempDir()
	write(t, filepath.Join(bin, "git"), "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --show-scope ] && { echo \"error: unknown option \\`show-scope'\" >&2; exit 129; }; done\nexec "+real+" \"$@\"\n")
	os.Chmod(filepath.Join(bin, "git"), 0o755)
	ctx := context.Background()
	repo := newRepo(t)
	ran := t.TempDir()
	trap := filepath.Join(t.TempDir(), "trap")
	write(t, trap, "#!/bin/sh\ntouch '"+filepath.Join(ran, "filter")+"'\ncat\n")
	os.Chmod(trap, 0o755)
	git(t, repo, "config", "filter.x.clean", trap)
	write(t, filepath.Join(repo, ".gitattributes"), "*.txt filter=x\n")
	write(t, filepath.Join(repo, "a.txt"), "edited\n")
	os.RemoveAll(ran)
	os.MkdirAll(ran, 0o755)

	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	s, err := Prepare(ctx, repo, "", true)
	if err == nil {
		s.Close()
		t.Error("the start went on though git could not tell the person's configuration from the repository's")
	} else if !strings.Contains(err.Error(), "git 2.26 or later") {
		t.Errorf("the start refused without saying why: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ran, "filter")); err == nil {
		t.Errorf("the start --with-changes ran the clean filter the repository's .git/config names (the scope query failed and nothing was switched off)")
	}
}
