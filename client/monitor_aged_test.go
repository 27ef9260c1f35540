package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/nats-io/nats.go"
	"strings"
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
// And with nothing stored of its turns, every turn its record says began
// was begun and cancelled again: an idle agent's last one, and a working
// agent's every turn before the running one (an outside review found the
// working case).
func TestNodeLossClosesAnAgedOutAgentAfterItsLastEvent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		working bool
		want    string // the closing events, kind@turn
	}{
		{"idle after turn 2", false, "[error@2 status@2]"},
		{"working on turn 3", true, "[turn_started@3 error@3 result@3 status@3]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b, nc, js, ctx, nodes, agents := nodeLossFabric(t)
			a := &agentStream{t: t, js: js, id: "aged"}
			a.emit(0, schemas.Status{Status: schemas.StatusIdle})
			a.turn(1, "one")
			a.turn(2, "two")
			rec := schemas.AgentRecord{ID: "aged", Status: schemas.StatusIdle, Turn: 2, Node: "n1", EventLog: "/x"}
			if c.working {
				a.emit(2, schemas.UserText{Content: schemas.Text("three")})
				a.emit(3, schemas.Status{Status: schemas.StatusWorking})
				a.emit(3, schemas.TurnStarted{})
				rec.Status, rec.Turn = schemas.StatusWorking, 3
			}
			rec.LastEvent = a.n
			raw, _ := json.Marshal(rec)
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
					kinds = append(kinds, fmt.Sprintf("%s@%d", r.Kind, r.Turn))
					return nil
				})
				return err == nil && len(kinds) > 0 && strings.HasPrefix(kinds[len(kinds)-1], "status@")
			})
			if got[0] != a.n+1 {
				t.Errorf("the closing events are numbered %v; the node's record says it numbered %d events", got, a.n)
			}
			if fmt.Sprint(kinds) != c.want {
				t.Errorf("the agent is closed with %v; want %s", kinds, c.want)
			}
		})
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
