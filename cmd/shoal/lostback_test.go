package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	records, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// The stored record, which the coordinator closes the turn from (shoal
	// status asks the node, which may not have written it yet).
	poll.Until(t, 60*time.Second, "the record says what the running turn used", func() bool {
		var rec schemas.AgentRecord
		e, err := records.Get(t.Context(), id)
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Running != nil
	})
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

	stream, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	// What the stream holds of the agent: nothing of the node's after
	// the coordinator's dead status.
	cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	var closed *schemas.Usage
	dead, after := false, 0
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break
		}
		ev, err := schemas.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		byCloser := m.Headers().Get(schemas.HeaderNode) == schemas.CloserName
		switch pl := ev.Payload.(type) {
		case schemas.Result:
			if byCloser {
				closed = pl.Usage
			}
		case schemas.Status:
			if byCloser && pl.Status == schemas.StatusDead {
				dead = true
				continue
			}
		}
		if dead && !byCloser {
			after++
		}
	}
	if !dead || closed == nil {
		t.Fatalf("the coordinator's close: dead status %v, cancelled result's use %v", dead, closed)
	}
	if after > 0 {
		t.Errorf("the node, back, stored %d events of its agent after the coordinator's dead status", after)
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
