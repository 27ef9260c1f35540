package coordinator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// Two coordinators' monitors, started together, both find twenty cut-off
// closes at their grace sweep and finish them at once: each stream is
// numbered 1..last_event once each and ends dead. (Held.)
func TestTwoMonitorsFinishingTheSameClosesStoreEachEventOnce(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 90*time.Second)
	stream, _ := js.Stream(ctx, schemas.StreamName)
	agents, _ := js.KeyValue(ctx, schemas.AgentsBucket)
	var deads []schemas.AgentRecord
	for i := range 20 {
		id := fmt.Sprintf("a%d", i)
		for n, ev := range []schemas.Event{{Turn: 1, Payload: schemas.TurnStarted{}}, {Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("x")}}} {
			env, _ := schemas.Encode(ev)
			m := nats.NewMsg(schemas.EventSubject(id))
			m.Data = env
			m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, uint64(n+1)))
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		now := float64(time.Now().Unix())
		live := schemas.AgentRecord{ID: id, Node: "n1", Status: schemas.StatusWorking, Turn: 3, Held: 2, LastEvent: 2, EventLog: "x",
			CreatedAt: now, LastActivity: now}
		tail, _, err := client.StreamTail(ctx, nc, stream, id)
		if err != nil {
			t.Fatal(err)
		}
		dead := schemas.CloseLost(live, tail, "node n1 was lost", schemas.CloserName)
		putJSON(t, agents, id, dead)
		deads = append(deads, dead)
	}
	for range 2 {
		c := natstest.Connect(t, b)
		m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: c, Grace: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		fabrictest.Run(t, m)
	}
	time.Sleep(5 * time.Second)
	for _, dead := range deads {
		c, _ := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(dead.ID)}})
		want := uint64(1)
		var last schemas.Event
		for {
			msg, err := c.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
			if err != nil {
				break
			}
			_, n, _ := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID))
			if n != want {
				t.Errorf("%s: event %d where %d was due", dead.ID, n, want)
			}
			want = n + 1
			last, _ = schemas.Decode(msg.Data())
		}
		if st, ok := last.Payload.(schemas.Status); want-1 != dead.LastEvent || !ok || st.Status != schemas.StatusDead {
			t.Errorf("%s: stream ends at %d (%v), record at %d", dead.ID, want-1, last.Kind(), dead.LastEvent)
		}
	}
}
