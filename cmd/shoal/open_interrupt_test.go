package main

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/poll"
)

// `shoal open --repo` stopped by Ctrl-C while git builds the bundle
// leaves nothing of the bundle in the temp directory, and exits 130:
// SIGINT to its whole process group, git's included, as a terminal sends
// it; or to shoal alone (kill -INT), which kills its git: git's lock file
// beside the bundle's path was then left behind, as large as what it had
// bundled (an outside review: 150 MB in $TMPDIR at each interrupt), and
// the open exited 1 saying git was killed. A terminal closed (an SSH
// session dropped) sends SIGHUP to the group, which stops it the same
// way: it died at once, leaving git writing a bundle no one removed.
func TestOpenStoppedByCtrlCWhileBundlingLeavesNoBundle(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		group bool
		sig   syscall.Signal
	}{{"the process group", true, syscall.SIGINT}, {"shoal alone", false, syscall.SIGINT}, {"hangup", true, syscall.SIGHUP}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			openStoppedWhileBundling(t, c.group, c.sig)
		})
	}
}

// openStoppedWhileBundling sends sig to `shoal open --repo` as it
// bundles, to its process group or to it alone.
func openStoppedWhileBundling(t *testing.T, group bool, sig syscall.Signal) {
	c := startCoordinator(t, nil)
	repo := t.TempDir()
	git := func(args ...string) { gittest.Git(t, repo, args...) }
	git("init", "-q", "-b", "main")
	for i := range 4 {
		noise := make([]byte, 24<<20) // incompressible: zlib works through all of it
		rand.Read(noise)
		os.WriteFile(filepath.Join(repo, "noise"+string(rune('a'+i))), noise, 0o644)
	}
	git("add", ".")
	git("commit", "-q", "-m", "noise")
	tmp := t.TempDir()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "open", "--repo", repo, "--id", "cut", "--permission", "bypass")
	cmd.Env = append(append(baseEnv(dir), c.client...), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	poll.Until(t, time.Minute, "git writes the bundle", func() bool { return bundleIn(tmp, 1<<20) != "" })
	if group {
		syscall.Kill(-cmd.Process.Pid, sig)
	} else {
		cmd.Process.Signal(sig)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("shoal open did not stop at %v; it said:\n%s", sig, stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
		t.Errorf("shoal open stopped by %v exited %d, want %d; it said:\n%s", sig, code, exitInterrupted, stderr.String())
	}
	poll.Until(t, 10*time.Second, "the temp directory holds nothing of the bundle", func() bool { return bundleIn(tmp, 0) == "" })
}

// bundleIn names a file of a bundle under dir of more than size bytes
// ("" for none).
func bundleIn(dir string, size int64) string {
	var found string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.Contains(path, "shoal-bundle-") {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.Size() > size {
			found = path
		}
		return nil
	})
	return found
}
