package coordinator_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// gateDialer holds the first write of its connection that publishes on
// subject until open is closed: the monitor's first closing event waits
// on the wire, as one on a loaded link or server does.
type gateDialer struct {
	subject string
	held    chan struct{} // closed once a write is held
	open    chan struct{}
	once    sync.Once
}

func (d *gateDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &gateConn{Conn: c, d: d}, nil
}

type gateConn struct {
	net.Conn
	d *gateDialer
}

func (c *gateConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("PUB "+c.d.subject+" ")) {
		c.d.once.Do(func() { close(c.d.held) })
		<-c.d.open
	}
	return c.Conn.Write(b)
}

// The monitor closing a lost node's agent writes its record dead (keeping
// the close) and then stores the closing events. An open of the id in
// between numbered its new life from where the close's events begin, so
// the new life and the close's events took the same numbers: whichever
// was stored first, the other was dropped as a copy, and the close's
// events still to come were stored inside the new life (its stream said
// the turn cancelled and the agent dead while it lived). An open waits
// for the close to be stored, and the new life numbers after it.
func TestMonitorStoresNoClosingEventsIntoANewLife(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 90*time.Second)
	const id = "r1"
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(n uint64, ev schemas.Event) {
		t.Helper()
		env, err := schemas.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(schemas.EventSubject(id))
		m.Data = env
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, n))
		m.Header.Set(schemas.HeaderNode, "ghost")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Node ghost ran turn 1 and is gone (no entry in the nodes bucket).
	publish(1, schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}})
	publish(2, schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("half a")}})
	now := float64(time.Now().Unix())
	putJSON(t, agents, id, schemas.AgentRecord{ID: id, Node: "ghost", Status: schemas.StatusWorking, Turn: 1, LastEvent: 2,
		EventLog: id + ".jsonl", Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "old-life"})

	fabrictest.Node(t, b, node.Config{Name: "n2", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}

	gate := &gateDialer{subject: schemas.EventSubject(id), held: make(chan struct{}), open: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(gate.open)
		}
	}
	mc := natstest.Connect(t, b, nats.SetCustomDialer(gate))
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: mc, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	t.Cleanup(release) // before the monitor is waited for
	// The grace sweep closes ghost's agent: the record is written dead,
	// and its first closing event is on its way.
	select {
	case <-gate.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the monitor never published a closing event")
	}
	e, err := agents.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var dead schemas.AgentRecord
	if err := json.Unmarshal(e.Value(), &dead); err != nil || dead.Status != schemas.StatusDead || dead.Closing == nil {
		t.Fatalf("the record while the close's events are on their way: %s %v", e.Value(), err)
	}

	// The id is opened again, on n2, meanwhile: the open waits for the
	// close's events, which land a moment later.
	opened := make(chan error, 1)
	go func() {
		_, err := f.Open(ctx, schemas.OpenRequest{ID: id, CWD: t.TempDir(), Node: "n2"})
		opened <- err
	}()
	select {
	case err := <-opened:
		t.Fatalf("the id was opened again while its close was being stored: %v", err)
	case <-time.After(time.Second):
	}
	release()
	if err := <-opened; err != nil {
		t.Fatalf("reopen once the close is stored: %v", err)
	}
	run, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: "hi"})
	t.Logf("new life's turn: %q %v", run.Text, err)
	if _, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: "again"}); err != nil {
		t.Logf("the new life's second turn: %v", err)
	}
	time.Sleep(time.Second)

	// Every event past the old life's close is the new life's, n2's;
	// none of the close's is stored into it.
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	bad := false
	for {
		msg, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			break
		}
		_, n, _ := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID))
		from := msg.Headers().Get(schemas.HeaderNode)
		kind := "?"
		if ev, err := schemas.Decode(msg.Data()); err == nil {
			kind = string(ev.Payload.Kind())
			if st, ok := ev.Payload.(schemas.Status); ok {
				kind += ":" + string(st.Status)
			}
		}
		got = append(got, fmt.Sprintf("%d %s %s", n, from, kind))
		// In order, gapless; the old life's close to its last event,
		// the new life's after it.
		if n != uint64(len(got)) || (n > dead.LastEvent) != (from == "n2") {
			bad = true
		}
	}
	rec, _ := f.Status(ctx, id)
	if bad {
		t.Fatalf("the close's events were stored into the id's new life (record now %s on %s):\n%s", rec.Status, rec.Node, strings.Join(got, "\n"))
	}
	t.Logf("stream:\n%s", strings.Join(got, "\n"))
}
