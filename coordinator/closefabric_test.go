package coordinator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// closeFabric is a broker, with what the tests of a lost node's agents'
// closes write and read: the agents' streams and records.
type closeFabric struct {
	t      *testing.T
	b      *broker.Broker
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	agents jetstream.KeyValue
}

func newCloseFabric(t *testing.T) *closeFabric {
	t.Helper()
	return newCloseFabricOn(t, natstest.Start(t))
}

// newCloseFabricOn is a closeFabric on b.
func newCloseFabricOn(t *testing.T, b *broker.Broker) *closeFabric {
	t.Helper()
	f := &closeFabric{t: t, b: b}
	f.nc, f.js = natstest.JetStream(t, f.b)
	var err error
	if f.stream, err = f.js.Stream(t.Context(), schemas.StreamName); err != nil {
		t.Fatal(err)
	}
	if f.agents, err = f.js.KeyValue(t.Context(), schemas.AgentsBucket); err != nil {
		t.Fatal(err)
	}
	return f
}

// publish stores agent id's event number n, from node.
func (f *closeFabric) publish(id string, n uint64, ev schemas.Event, node string) {
	f.t.Helper()
	env, err := schemas.Encode(ev)
	if err != nil {
		f.t.Fatal(err)
	}
	m := nats.NewMsg(schemas.EventSubject(id))
	m.Data = env
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, n))
	m.Header.Set(schemas.HeaderNode, node)
	if _, err := f.js.PublishMsg(f.t.Context(), m); err != nil {
		f.t.Fatal(err)
	}
}

// lostMidTurn stores turn 1's start and a text of agent id on node n1,
// and returns the record n1 last wrote of it, working.
func (f *closeFabric) lostMidTurn(id string) schemas.AgentRecord {
	f.t.Helper()
	f.publish(id, 1, schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}, "n1")
	f.publish(id, 2, schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("half a")}}, "n1")
	now := float64(time.Now().Unix())
	return schemas.AgentRecord{ID: id, Node: "n1", Status: schemas.StatusWorking, Turn: 1, LastEvent: 2, EventLog: id + ".jsonl",
		Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "life-1"}
}

// cutOffClose writes live's record as the monitor does when it closes
// the agent, and returns it: its closing events are not stored.
func (f *closeFabric) cutOffClose(live schemas.AgentRecord) schemas.AgentRecord {
	f.t.Helper()
	tail, _, err := client.StreamTail(f.t.Context(), f.nc, f.stream, live.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	dead := schemas.CloseLost(live, tail, "node "+live.Node+" was lost", schemas.CloserName)
	putJSON(f.t, f.agents, live.ID, dead)
	return dead
}

// conn is a connection of its own to the fabric.
func (f *closeFabric) conn() *nats.Conn { return natstest.Connect(f.t, f.b) }

// monitor runs a monitor on conn (the fabric's own when nil) whose grace
// sweep comes after grace.
func (f *closeFabric) monitor(conn *nats.Conn, grace time.Duration) {
	f.t.Helper()
	if conn == nil {
		conn = f.nc
	}
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: conn, Grace: grace})
	if err != nil {
		f.t.Fatal(err)
	}
	fabrictest.Run(f.t, m)
}

// stored is an event as the stream holds it.
type stored struct {
	n    uint64
	node string
	ev   schemas.Event
}

// events are agent id's events in the stream, in its order, read until
// none comes for wait.
func (f *closeFabric) events(id string, wait time.Duration) []stored {
	f.t.Helper()
	c, err := f.stream.OrderedConsumer(f.t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		f.t.Fatal(err)
	}
	var got []stored
	for {
		msg, err := c.Next(jetstream.FetchMaxWait(wait))
		if err != nil {
			return got
		}
		_, n, _ := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID))
		ev, _ := schemas.Decode(msg.Data())
		got = append(got, stored{n: n, node: msg.Headers().Get(schemas.HeaderNode), ev: ev})
	}
}

// gapless says what is wrong with events as the whole of a stream closed
// at last: numbered 1 to last once each, in order, ending dead; "" when
// nothing is.
func gapless(events []stored, last uint64) string {
	if len(events) == 0 {
		return "no event stored"
	}
	for i, s := range events {
		if s.n != uint64(i+1) {
			return fmt.Sprintf("event %d stored where %d was due", s.n, i+1)
		}
	}
	if uint64(len(events)) != last {
		return fmt.Sprintf("the stream ends at %d, the record at %d", len(events), last)
	}
	if st, ok := events[len(events)-1].ev.Payload.(schemas.Status); !ok || st.Status != schemas.StatusDead {
		return fmt.Sprintf("the stream ends with %s, not dead", events[len(events)-1].ev.Kind())
	}
	return ""
}
