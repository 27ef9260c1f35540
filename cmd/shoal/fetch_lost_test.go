package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
)

// A fetch whose node is SIGKILLed while it bundles the agent's work fails
// once the node's heartbeat lapses, naming the node, as an open on a node
// lost on the way does: it waited out the work request's ten minutes (and
// a job, which fetches the same way, with it). Once the node is back, the
// fetch asked again brings the work back whole, and once.
func TestFetchFromANodeKilledMidBringBack(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--no-node", "--node-ttl", "3s")
	repo := oneCommitRepo(t, "repo", "hello\n")
	home, tmp := filepath.Join(t.TempDir(), "n1"), t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), c.fake.URL()), "XDG_CACHE_HOME="+home+"/cache", "TMPDIR="+tmp)
	env = append(env, c.client...)
	startNode := func() *shoalProc {
		p := startShoal(t, home, env, "node", "--name", "n1", "--claude", peers.Claude.Command(t)[0])
		p.waitLine("shoal: node n1 joined")
		return p
	}
	n1 := startNode()
	c.must("open", "--repo", repo, "--node", "n1", "--id", "w", "--permission", "bypass")
	in, _ := json.Marshal(map[string]string{"command": "head -c 48000000 /dev/urandom > big.bin", "description": "write"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	c.must("run", "w", "Write big.bin.")

	fetch := startShoal(t, t.TempDir(), c.client, "fetch", "w")
	poll.Until(t, 2*time.Minute, "the node bundles the work", func() bool {
		got, _ := filepath.Glob(filepath.Join(home, "cache", "shoal", "agents", "n1", "spool", "shoal-work-*"))
		return len(got) > 0
	})
	n1.stop(syscall.SIGKILL)
	select {
	case <-fetch.done:
	case <-time.After(time.Minute):
		fetch.stop(syscall.SIGKILL)
		t.Fatalf("the fetch still waits a minute after its node was killed; it said:\n%s", fetch.stderrText())
	}
	if code := fetch.cmd.ProcessState.ExitCode(); code != exitUnavailable || !strings.Contains(fetch.stderrText(), "node n1 was lost or stopped while it answered work") {
		t.Errorf("the fetch from a node killed under it: exit %d: %s", code, fetch.stderrText())
	}

	startNode()
	c.must("fetch", "w")
	if n := gitIn(t, repo, "cat-file", "-s", "shoal/w:big.bin"); n != "48000000" {
		t.Fatalf("big.bin on shoal/w is %s bytes", n)
	}
	// Fetched again: the branch is the work once, not the work twice.
	c.must("fetch", "w")
	if n := gitIn(t, repo, "rev-list", "--count", "main..shoal/w"); n != "1" {
		t.Errorf("shoal/w holds %s commits past main after a second fetch", n)
	}
}

// A node restarted with another --dir keeps no checkout of its agents in
// the old one: diff and fetch say so, naming the directory, where they
// said the agent "was not opened on a repository", which its record says
// it was.
func TestNodeRestartedWithAnotherDirSaysTheCheckoutIsGone(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--no-node", "--node-ttl", "3s")
	repo := oneCommitRepo(t, "repo", "hello\n")
	home := filepath.Join(t.TempDir(), "n1")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), c.fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	env = append(env, c.client...)
	startNode := func(dir string) *shoalProc {
		p := startShoal(t, home, env, "node", "--name", "n1", "--dir", dir, "--claude", peers.Claude.Command(t)[0])
		p.waitLine("shoal: node n1 joined")
		return p
	}
	n1 := startNode(filepath.Join(home, "A"))
	c.must("open", "--repo", repo, "--node", "n1", "--id", "w", "--permission", "bypass")
	n1.stop(syscall.SIGKILL)
	startNode(filepath.Join(home, "B"))
	for _, verb := range []string{"diff", "fetch"} {
		code, _, errOut := c.shoal(verb, "w")
		if code != exitNotFound || !strings.Contains(errOut, "node n1 keeps no checkout of agent w in "+filepath.Join(home, "B")) {
			t.Errorf("shoal %s of an agent whose node lost its checkout: exit %d: %s", verb, code, errOut)
		}
	}
}
