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
// result carrying the record's running use, and marked the agent dead;
// the node's own events of the turn, published straight to the stream (no
// --auth), land after the dead status, its real result among them, and
// shoal usage (and the coordinator's count) counted the one turn twice,
// partly and then whole. It counts once, whole. (That the node's events
// land after the dead status at all is not mended.)
func TestLostNodeComingBackCountsItsTurnOnce(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Thinking: "Slowly, then.", Text: strings.Repeat("slowly ", 60), ChunkSize: 7, Delay: 60 * time.Millisecond})
	n := p.node("sleeper")
	id, _ := p.openOn()
	p.must("send", id, "Take your time.")
	poll.Until(t, 60*time.Second, "the record says what the running turn used", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := p.shoal("status", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Running != nil
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

	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	// The turn's results as the stream has them: the coordinator's
	// cancelled one, and the node's own once it is back.
	results := func() (closed, own *schemas.Usage) {
		cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
		if err != nil {
			t.Fatal(err)
		}
		for {
			m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return closed, own
			}
			ev, err := schemas.Decode(m.Data())
			if r, ok := ev.Payload.(schemas.Result); err == nil && ok && r.Usage != nil {
				if m.Headers().Get(schemas.HeaderNode) == schemas.CloserName {
					closed = r.Usage
				} else {
					own = r.Usage
				}
			}
		}
	}
	var closed, own *schemas.Usage
	poll.Until(t, 60*time.Second, "the node back, the turn's own result stored after the coordinator's", func() bool {
		closed, own = results()
		return closed != nil && own != nil
	})
	var rep usageReport
	if err := json.Unmarshal([]byte(p.must("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Total.Turns != 1 || schemas.TokensOf(rep.Total.Usage) != schemas.TokensOf(*own) {
		t.Errorf("one turn ran, closed at %d tokens by the coordinator and %d in its own result; shoal usage counts %d turns, %d tokens",
			schemas.TokensOf(*closed), schemas.TokensOf(*own), rep.Total.Turns, schemas.TokensOf(rep.Total.Usage))
	}
}
