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

	"github.com/shoalfabric/shoal/client"
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
	f := newCloseFabric(t)
	ctx := natstest.Context(t, 90*time.Second)
	const id = "r1"
	// Node n1 ran turn 1 and is gone (no entry in the nodes bucket).
	putJSON(t, f.agents, id, f.lostMidTurn(id))

	fabrictest.Node(t, f.b, node.Config{Name: "n2", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	c, err := client.NewDirect(f.conn(), client.Config{})
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
	f.monitor(natstest.Connect(t, f.b, nats.SetCustomDialer(gate)), 200*time.Millisecond)
	t.Cleanup(release) // before the monitor is waited for
	// The grace sweep closes n1's agent: the record is written dead,
	// and its first closing event is on its way.
	select {
	case <-gate.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the monitor never published a closing event")
	}
	e, err := f.agents.Get(ctx, id)
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
		_, err := c.Open(ctx, schemas.OpenRequest{ID: id, CWD: t.TempDir(), Node: "n2"})
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
	if _, err := c.Run(ctx, schemas.RunRequest{AgentID: id, Text: "hi"}); err != nil {
		t.Fatalf("the new life's turn: %v", err)
	}

	// In order, gapless: the old life's close to its last event, the
	// new life's, n2's, after it.
	var got []string
	bad := false
	for i, s := range f.events(id, 2*time.Second) {
		got = append(got, fmt.Sprintf("%d %s %s", s.n, s.node, s.ev.Kind()))
		if s.n != uint64(i+1) || (s.n > dead.LastEvent) != (s.node == "n2") {
			bad = true
		}
	}
	if bad || len(got) <= int(dead.LastEvent) {
		t.Fatalf("the close's events and the id's new life, in the stream:\n%s", strings.Join(got, "\n"))
	}
}
