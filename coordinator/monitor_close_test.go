package coordinator_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator closing a lost node's agent writes the record dead and
// then stores the closing events; one that stopped between the two (or
// between two of the events) left a record that said dead over a stream
// that never did, and nothing finished it: a reader waited on a turn
// that would never end. The record keeps the close until its events are
// stored, and the next sweep stores those missing, numbered on.
func TestMonitorFinishesACloseItsCoordinatorStoppedIn(t *testing.T) {
	t.Parallel()
	for _, stored := range []int{0, 1} {
		t.Run(fmt.Sprintf("%d closing events stored", stored), func(t *testing.T) {
			t.Parallel()
			b := natstest.Start(t)
			nc, js := natstest.JetStream(t, b)
			ctx := t.Context()
			stream, err := js.Stream(ctx, schemas.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
			if err != nil {
				t.Fatal(err)
			}
			const id = "a1"
			publish := func(n uint64, ev schemas.Event, node string) {
				t.Helper()
				env, err := schemas.Encode(ev)
				if err != nil {
					t.Fatal(err)
				}
				m := nats.NewMsg(schemas.EventSubject(id))
				m.Data = env
				m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, n))
				m.Header.Set(schemas.HeaderNode, node)
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			// Turn 1 runs on node n1, which is lost mid-text.
			publish(1, schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}, "n1")
			publish(2, schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("half a")}}, "n1")
			now := float64(time.Now().Unix())
			live := schemas.AgentRecord{ID: id, Node: "n1", Status: schemas.StatusWorking, Turn: 1, LastEvent: 2, EventLog: id + ".jsonl",
				Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, Running: &schemas.Usage{OutputTokens: 7}}
			tail, _, err := client.StreamTail(ctx, nc, stream, id)
			if err != nil {
				t.Fatal(err)
			}
			// The close, as far as the coordinator got: the record, and
			// stored of the events.
			dead := schemas.CloseLost(live, tail, "node n1 was lost", schemas.CloserName)
			from, events, err := dead.ClosingEvents()
			if err != nil {
				t.Fatal(err)
			}
			if len(events) < 3 {
				t.Fatalf("the close of a running turn is %d events: %+v", len(events), events)
			}
			putJSON(t, agents, id, dead)
			for i := range stored {
				publish(from+1+uint64(i), events[i], schemas.CloserName)
			}

			m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			fabrictest.Run(t, m)
			poll.Until(t, 30*time.Second, "the agent's stream to end dead", func() bool {
				tail, _, err := client.StreamTail(ctx, nc, stream, id)
				return err == nil && tail.Dead
			})
			poll.Until(t, 10*time.Second, "the record to keep the close no longer", func() bool {
				e, err := agents.Get(ctx, id)
				var rec schemas.AgentRecord
				return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Closing == nil
			})
			// Every number once, in order, to the record's last; the
			// stream ends dead, the turn's result cancelled with what it
			// used.
			c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
			if err != nil {
				t.Fatal(err)
			}
			var got []schemas.Event
			for want := uint64(1); want <= dead.LastEvent; want++ {
				msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
				if err != nil {
					t.Fatalf("event %d of %d: %v", want, dead.LastEvent, err)
				}
				if _, n, _ := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID)); n != want {
					t.Fatalf("stored event %d where %d was due", n, want)
				}
				ev, err := schemas.Decode(msg.Data())
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev)
			}
			if msg, err := c.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
				t.Errorf("an event past the record's last (%d): %s", dead.LastEvent, msg.Headers().Get(schemas.HeaderMsgID))
			}
			last := got[len(got)-1]
			if st, ok := last.Payload.(schemas.Status); !ok || st.Status != schemas.StatusDead {
				t.Errorf("the stream ends with %+v, not dead", last)
			}
			var result *schemas.Result
			for _, ev := range got {
				if r, ok := ev.Payload.(schemas.Result); ok {
					result = &r
				}
			}
			if result == nil || result.StopReason != schemas.StopCancelled || result.Usage == nil || result.Usage.OutputTokens != 7 {
				t.Errorf("turn 1's result: %+v", result)
			}
		})
	}
}

// A close cut off so long ago that the agent's events aged out of the
// stream (its end with them, perhaps) is not stored again over nothing:
// the record drops it.
func TestMonitorStoresNoCloseOfEventsAgedOut(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := t.Context()
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	live := schemas.AgentRecord{ID: "aged", Node: "n1", Status: schemas.StatusWorking, Turn: 1, LastEvent: 2, EventLog: "aged.jsonl",
		Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now}
	putJSON(t, agents, "aged", schemas.CloseLost(live, schemas.Tail{Last: 2, Turn: 1, Open: true}, "node n1 was lost", schemas.CloserName))
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	poll.Until(t, 30*time.Second, "the record to keep the close no longer", func() bool {
		e, err := agents.Get(ctx, "aged")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Closing == nil
	})
	if info, err := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.EventSubject("aged"))); err != nil || len(info.State.Subjects) != 0 {
		t.Errorf("the close of events aged out was stored over nothing: %v %v", info.State.Subjects, err)
	}
}
