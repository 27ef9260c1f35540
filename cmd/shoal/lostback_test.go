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

// The same through the relay: a confined node stopped past its TTL came
// back and never stored an event again. The relay refused its record
// writes for good (the agent was dead; "reopening it is a new claim"), a
// refusal the node did not take for the word that it was taken for lost,
// so it retried them for ever, its events waiting behind; the dead
// agent's CLI ran on, and a new agent's turns ran but were never stored.
// Refused, the node reads the record again, stops the agent the fabric
// closed, and sends events again.
func TestLostConfinedNodeComingBackStopsItsAgentAndStoresAgain(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "client", "me")
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("slowly ", 60), ChunkSize: 7, Delay: 60 * time.Millisecond})
	open := func() string {
		var rep schemas.OpenReply
		if err := json.Unmarshal([]byte(p.must(t, "open", "--json", t.TempDir())), &rep); err != nil {
			t.Fatal(err)
		}
		return rep.AgentID
	}
	status := func(id string) schemas.AgentRecord {
		var rec schemas.AgentRecord
		json.Unmarshal([]byte(p.must(t, "status", id)), &rec)
		return rec
	}
	id := open()
	p.must(t, "send", id, "Take your time.")
	poll.Until(t, 60*time.Second, "the turn runs", func() bool { return status(id).Status == schemas.StatusWorking })
	if err := p.node.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			p.node.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	poll.Until(t, 60*time.Second, "the coordinator takes the agent for lost", func() bool { return status(id).Status == schemas.StatusDead })
	time.Sleep(3 * time.Second)
	p.node.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	poll.Until(t, 60*time.Second, "the node, back, says the fabric took its agent for lost", func() bool {
		return strings.Contains(p.node.stderrText(), "the fabric took this agent for lost")
	})
	poll.Until(t, 60*time.Second, "the node back, its agent stopped", func() bool {
		var rep struct{ Nodes []schemas.NodeRecord }
		code, out, _ := runShoal(t, t.TempDir(), p.as, "nodes", "--json")
		return code == 0 && json.Unmarshal([]byte(out), &rep) == nil && len(rep.Nodes) == 1 && rep.Nodes[0].Agents == 0
	})
	// It stores again: a new agent's turn is in the stream.
	p.fake.Script(fakemodel.Reply{Text: "Back again."})
	again := open()
	if out := p.must(t, "run", again, "Are you back?"); !strings.Contains(out, "Back again.") {
		t.Fatalf("shoal run on the node, back: %q", out)
	}
	if out := p.must(t, "output", again); !strings.Contains(out, "Back again.") {
		t.Errorf("the new agent's turn is not in the stream: %q", out)
	}
}
