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

// A node taken for lost (its heartbeat expired: stopped past
// --node-ttl, as a partition or a paused VM does) whose agent's turn went
// on comes back: the coordinator has closed the turn with a cancelled
// result carrying the record's running use, and marked the agent dead.
// The node, back, published the rest of the turn straight to the stream
// (no --auth) after the dead status, its own result among them, and only
// learnt it was taken for lost at its next record write. A node whose
// heartbeat went unwritten for its TTL now asks its agents' records before
// it sends another event: it stores nothing after the death, stops the
// agent, and shoal usage counts the one turn once, as the coordinator
// closed it.
func TestLostNodeComingBackStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Thinking: "Slowly, then.", Text: strings.Repeat("slowly ", 60), ChunkSize: 7, Delay: 60 * time.Millisecond})
	n := p.node("sleeper")
	id, _ := p.openOn()
	p.must("send", id, "Take your time.")
	f := openLeaseFabric(t, p.url)
	f.runningRecorded(id)
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			n.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	poll.Until(t, 60*time.Second, "the coordinator takes the agent for lost", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := p.shoal("status", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusDead
	})
	time.Sleep(6 * time.Second) // the CLI goes on; its turn ends into the stopped node's pipe
	n.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	poll.Until(t, 60*time.Second, "the node, back, says the fabric took its agent for lost", func() bool {
		return strings.Contains(n.stderrText(), "the fabric took this agent for lost")
	})
	poll.Until(t, 60*time.Second, "the node back, its agent stopped", func() bool {
		code, out, _ := p.shoal("nodes", "--json")
		var rep struct{ Nodes []schemas.NodeRecord }
		return code == 0 && json.Unmarshal([]byte(out), &rep) == nil && len(rep.Nodes) == 1 && rep.Nodes[0].Agents == 0
	})

	// What the stream holds of the agent: nothing of the node's after
	// the coordinator's dead status.
	after, first, closed := f.closing(id)
	if closed == nil {
		t.Fatal("the coordinator's cancelled result carries no use")
	}
	if after > 0 {
		t.Errorf("the node, back, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
	}
	var rep usageReport
	if err := json.Unmarshal([]byte(p.must("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Total.Turns != 1 || schemas.TokensOf(rep.Total.Usage) != schemas.TokensOf(*closed) {
		t.Errorf("one turn ran, closed at %d tokens by the coordinator; shoal usage counts %d turns, %d tokens",
			schemas.TokensOf(*closed), rep.Total.Turns, schemas.TokensOf(rep.Total.Usage))
	}
}
