package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/nats-io/nats.go"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A lost node's agent whose events have all aged out of the stream is
// closed with events numbered after the last its record says the node
// numbered: the monitor numbered them after the stream's end (nothing of
// the agent) or its earlier lives (none), from 1 again, numbers this life
// had handed out, and an observer resuming after the last event it saw
// skipped them (here, within the stream's duplicate window, they were
// dropped as copies of the aged-out events: the stream never said dead).
// And with nothing stored of its turns, an idle agent's last turn, which
// its record says ended, was begun and cancelled again.
func TestNodeLossClosesAnAgedOutAgentAfterItsLastEvent(t *testing.T) {
	t.Parallel()
	b, nc, js, ctx, nodes, agents := nodeLossFabric(t)
	a := &agentStream{t: t, js: js, id: "aged"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	a.turn(1, "done")
	raw, _ := json.Marshal(schemas.AgentRecord{ID: "aged", Status: schemas.StatusIdle, Turn: 1, LastEvent: a.n, Node: "n1", EventLog: "/x"})
	if _, err := agents.Put(ctx, "aged", raw); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(schemas.EventSubject("aged"))); err != nil {
		t.Fatal(err)
	}
	beat, _ := json.Marshal(schemas.NodeRecord{Name: "n1"})
	if _, err := nodes.Put(ctx, "n1", beat); err != nil {
		t.Fatal(err)
	}
	fabrictest.Monitor(t, natstest.Connect(t, b), 100*time.Millisecond)

	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	var kinds []string
	poll.Until(t, 20*time.Second, "the lost node's agent to be closed", func() bool {
		got, kinds = got[:0], kinds[:0]
		err := f.Replay(ctx, []string{"aged"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
			got = append(got, r.N) // a gap before the first is the aged-out events'
			kinds = append(kinds, string(r.Kind))
			return nil
		})
		return err == nil && len(got) > 0
	})
	poll.Until(t, 20*time.Second, "the agent's record to say dead", func() bool {
		e, err := agents.Get(ctx, "aged")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
	})
	if got[0] != a.n+1 {
		t.Errorf("the closing events are numbered %v; the node's record says it numbered %d events", got, a.n)
	}
	// Its record says turn 1 ended (idle): it is not begun and cancelled.
	if fmt.Sprint(kinds) != "[error status]" {
		t.Errorf("the idle agent is closed with %v; want [error status]", kinds)
	}
}

// nodeLossFabric is a broker whose nodes' heartbeat entries live a
// second, a connection to it with JetStream, a context for the test, and
// the nodes' and agents' buckets.
func nodeLossFabric(t *testing.T) (*broker.Broker, *nats.Conn, jetstream.JetStream, context.Context, jetstream.KeyValue, jetstream.KeyValue) {
	t.Helper()
	b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = time.Second })
	nc, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 30*time.Second)
	nodes, err := js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	return b, nc, js, ctx, nodes, agents
}
