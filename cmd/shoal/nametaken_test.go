package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A node stopped past its TTL is taken for lost, and another node may
// start under its name (a replacement). The first one, back, beat over
// the second's entry: both ran as one name, the record's life flipping
// between them, requests answered by one and turns run by the other (a
// run reported failed had run). The one back finds the name's entry is
// another life's, stops its agents (the fabric closed them) and exits,
// leaving the name, its entry and its agents to the replacement.
func TestNodeBackAfterItsNameWasTakenStops(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	old := p.node("nc")
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("slowly ", 60), ChunkSize: 7, Delay: 60 * time.Millisecond})
	first, _ := p.openOn("--node", "nc")
	p.must("send", first, "Take your time.")
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			old.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	status := func(id string) schemas.AgentRecord {
		var rec schemas.AgentRecord
		json.Unmarshal([]byte(p.must("status", id)), &rec)
		return rec
	}
	poll.Until(t, 60*time.Second, "the stopped node's agent is taken for lost", func() bool { return status(first).Status == schemas.StatusDead })
	replacement := p.node("nc", "--dir", t.TempDir())
	second, _ := p.openOn("--node", "nc")
	old.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	select {
	case <-old.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the node back under a taken name did not stop; it said:\n%s", old.stderrText())
	}
	if !strings.Contains(old.stderrText(), "another node took this node's name while it was away") {
		t.Errorf("the node back did not say why it stopped:\n%s", old.stderrText())
	}
	// The replacement holds the name: its agent runs, and its entry stays.
	p.fake.Script(fakemodel.Reply{Text: "The replacement's."})
	if out := p.must("run", second, "Who runs me?"); !strings.Contains(out, "The replacement's.") {
		t.Errorf("the replacement's agent: %q", out)
	}
	var rep struct{ Nodes []schemas.NodeRecord }
	json.Unmarshal([]byte(p.must("nodes", "--json")), &rep)
	if len(rep.Nodes) != 1 || rep.Nodes[0].Agents != 1 {
		t.Errorf("the nodes after the one back stopped: %+v", rep.Nodes)
	}
	select {
	case <-replacement.done:
		t.Fatalf("the replacement stopped:\n%s", replacement.stderrText())
	default:
	}
}
