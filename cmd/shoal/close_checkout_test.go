package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
)

// An open on a repository makes the agent's checkout before the agent is
// the node's; a close meanwhile said "no such agent" and the agent came
// up after it and stayed, and a send said the node had restarted (an
// outside review, with a checkout of some 300 MB). A close of an agent
// whose checkout is being made ends its open, and a send says it is
// still starting. The node's git here sleeps before making a checkout.
func TestACloseWhileTheCheckoutIsMadeEndsTheOpen(t *testing.T) {
	t.Parallel()
	p, _ := newOutagePool(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	bin := filepath.Join(p.dir, "slowgit")
	began := filepath.Join(p.dir, "checkout-began")
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("this test needs git: %v", err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ncase \" $* \" in *\" checkout --quiet -b \"*) : > " + began + "; sleep 6;; esac\nexec " + realGit + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p.remoteNode(t, fake, "PATH="+bin+":"+os.Getenv("PATH"))

	repo := oneCommitRepo(t, "repo", "hello\n")
	open := startShoal(t, t.TempDir(), p.client, "open", "--repo", repo, "--node", "remote", "--id", "w", "--permission", "bypass")
	poll.Until(t, time.Minute, "the node begins the agent's checkout", func() bool {
		_, err := os.Stat(began)
		return err == nil
	})
	if code, _, errOut := runShoal(t, t.TempDir(), p.client, "send", "w", "hello?"); code == 0 || !strings.Contains(errOut, "still starting") {
		t.Errorf("a send while the agent's checkout is made: exit %d, %q; want it refused as still starting", code, errOut)
	}
	if code, out, errOut := runShoal(t, t.TempDir(), p.client, "close", "w"); code != 0 {
		t.Errorf("the close while the agent's checkout is made: exit %d, %q %q", code, out, errOut)
	}
	select {
	case <-open.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the open still waits 30 s after its agent was closed")
	}
	if code := open.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(open.stderrText(), "closed as it started") {
		t.Errorf("the open of an agent closed as its checkout was made: exit %d, %q", code, open.stderrText())
	}
	time.Sleep(2 * time.Second) // an agent that came up after the close would be live by now
	_, out, _ := runShoal(t, t.TempDir(), p.client, "ls")
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "w" && f[2] != "dead" {
			t.Errorf("after its close the agent is %s:\n%s", f[2], out)
		}
	}
}

// A send or run to an agent whose CLI died says why, as its stream does:
// "agent 'x' is dead" alone left a person whose CLI was not logged in
// with nothing to go on but `shoal tail` (an outside review). The CLI
// here exits a second after it starts, so during the first turn: the
// turn's own ending ("… during turn 1") comes after what the CLI said,
// and gives way to it.
func TestATurnForADeadAgentSaysWhyItDied(t *testing.T) {
	t.Parallel()
	p, _ := newOutagePool(t)
	home := filepath.Join(p.dir, "node")
	cli := filepath.Join(p.dir, "claude")
	if err := os.WriteFile(cli, []byte("#!/bin/sh\n[ \"$1\" = --version ] && { echo '2.1.197 (Claude Code)'; exit 0; }\nsleep 1\necho 'fatal: cannot start (no login)' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	startShoal(t, home, []string{"XDG_CACHE_HOME=" + home + "/cache"}, "node", "--nats", p.url, "--name", "n1", "--claude", cli).waitLine("shoal: node n1 joined")
	if code, _, errOut := runShoal(t, t.TempDir(), p.client, "open", "--node", "n1", "--id", "nologin", t.TempDir()); code != 0 {
		t.Fatalf("open: exit %d: %s", code, errOut)
	}
	var said string
	poll.Until(t, 30*time.Second, "a turn for the agent is refused as dead", func() bool {
		_, _, said = runShoal(t, t.TempDir(), p.client, "run", "nologin", "hello?")
		return strings.Contains(said, "is dead")
	})
	for _, want := range []string{"agent 'nologin' is dead: its life on node n1 ended: ", "fatal: cannot start (no login)", "shoal open --id nologin"} {
		if !strings.Contains(said, want) {
			t.Errorf("a run for an agent whose CLI exited said %q; want it to say %q", said, want)
		}
	}
}
