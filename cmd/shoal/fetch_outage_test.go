package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
)

// A fetch whose coordinator is killed while the node bundles the agent's
// work, and is back a few seconds later, brings the work back once it is:
// the node's answer went into a connection that was away and was lost
// (nothing buffers it), and the fetch waited in silence for the first
// third of its ten minutes, though the node was there and a second fetch
// meanwhile took seconds; it watched only for the node's heartbeat entry
// to go, which in a short outage it does not. The fetch asks again once
// its connection is back (the same work is the same bundle, stored once),
// and a wait that goes on says what it waits for.
func TestFetchOutlivesACoordinatorRestartMidBundle(t *testing.T) {
	t.Parallel()
	p, up := newOutagePool(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	home := p.remoteNode(t, fake)

	repo := oneCommitRepo(t, "repo", "hello\n")
	if code, _, errOut := runShoal(t, t.TempDir(), p.client, "open", "--repo", repo, "--node", "remote", "--id", "w", "--permission", "bypass"); code != 0 {
		t.Fatalf("open: %s", errOut)
	}
	in, _ := json.Marshal(map[string]string{"command": "head -c 100000000 /dev/urandom > big.bin", "description": "write"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	if code, _, errOut := runShoal(t, t.TempDir(), p.client, "run", "w", "Write big.bin."); code != 0 {
		t.Fatalf("run: %s", errOut)
	}

	bundling := func() bool {
		got, _ := filepath.Glob(filepath.Join(home, "cache", "shoal", "agents", "remote", "spool", "shoal-work-*"))
		return len(got) > 0
	}
	fetch := startShoal(t, t.TempDir(), p.client, "fetch", "w")
	poll.Until(t, 2*time.Minute, "the node bundles the work", bundling)
	up.stop(syscall.SIGKILL)
	// The node ends its answer while the coordinator is away, so that its
	// reply is lost: its bundle made, it cannot store it.
	poll.Until(t, 30*time.Second, "the node ends its answer", func() bool { return !bundling() })
	p.coordinator(t)

	select {
	case <-fetch.done:
	case <-time.After(90 * time.Second):
		fetch.stop(syscall.SIGKILL)
		t.Fatalf("the fetch still waits 90 s after the coordinator came back, its node there; it said:\n%s", fetch.stderrText())
	}
	if code := fetch.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the fetch across a coordinator restart: exit %d:\n%s", code, fetch.stderrText())
	}
	if n := gitIn(t, repo, "cat-file", "-s", "shoal/w:big.bin"); n != "100000000" {
		t.Fatalf("big.bin on shoal/w is %s bytes", n)
	}
	if n := gitIn(t, repo, "rev-list", "--count", "main..shoal/w"); n != "1" {
		t.Errorf("shoal/w holds %s commits past main, the work fetched once", n)
	}
	t.Logf("the fetch said:\n%s", fetch.stderrText())
	if !strings.Contains(fetch.stderrText(), "waiting for node remote to bundle the work of agent w") {
		t.Errorf("the fetch's long wait did not say what it waited for; it said:\n%s", fetch.stderrText())
	}
}
