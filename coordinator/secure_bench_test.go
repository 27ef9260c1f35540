package coordinator_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/tlstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// turnRig drives turns of one agent and watches its events arrive.
type turnRig struct {
	f      *client.Direct
	id     string
	chunks int
	seen   chan *nats.Msg
}

func newTurnRig(b *testing.B, f *client.Direct, observer *nats.Conn, chunks int) *turnRig {
	ctx := natstest.Context(b, time.Minute)
	open, err := f.Open(ctx, schemas.OpenRequest{CWD: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	r := &turnRig{f: f, id: open.AgentID, chunks: chunks, seen: make(chan *nats.Msg, 1<<16)}
	sub, err := observer.ChanSubscribe(schemas.EventSubject(r.id), r.seen)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sub.Unsubscribe() })
	if err := observer.Flush(); err != nil {
		b.Fatal(err)
	}
	return r
}

// turn sends a turn and returns how many of its events the observer saw
// up to its result.
func (r *turnRig) turn(b *testing.B) int {
	ctx := natstest.Context(b, time.Minute)
	if _, err := r.f.Send(ctx, schemas.SendRequest{AgentID: r.id, Text: fmt.Sprintf("stream %d", r.chunks)}); err != nil {
		b.Fatal(err)
	}
	n := 0
	for {
		select {
		case m := <-r.seen:
			if bytes.HasPrefix(m.Data, []byte(`{"kind":"status","turn":0`)) {
				continue
			}
			n++
			if bytes.HasPrefix(m.Data, []byte(`{"kind":"result"`)) {
				return n
			}
		case <-ctx.Done():
			b.Fatalf("the observer saw %d events, and no result", n)
		}
	}
}

// BenchmarkSecuredVsPlainEvents streams the same turns through two
// fabrics in one run: a plain one (no TLS, no authentication, the node
// publishing to the stream itself) and a secured one (TLS on every
// connection, the node and the observer with their own credentials, the
// node confined, so its events pass the coordinator's relay and its
// ownership check). It reports both rates of events reaching an observer
// and their ratio (secured/plain).
func BenchmarkSecuredVsPlainEvents(b *testing.B) {
	const chunks = 2000
	bs := []backend.Backend{fakebackend.New(fakebackend.Config{})}

	// Plain.
	pb := natstest.Start(b)
	pnc := natstest.Connect(b, pb)
	h, err := node.New(node.Config{Name: "plain", Conn: pnc, Dir: b.TempDir(), Backends: bs})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-h.Ready()
	pf, err := client.NewDirect(natstest.Connect(b, pb), client.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := pf.WatchNodes(ctx); err != nil {
		b.Fatal(err)
	}
	waitNode(b, pf, "plain")
	plain := newTurnRig(b, pf, natstest.Connect(b, pb), chunks)

	// Secured.
	ca := tlstest.NewCA(b, "bench")
	pair := ca.Issue(b, "coordinator")
	s := fabrictest.StartSecured(b, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{Cert: pair.Cert, Key: pair.Key, CA: ca.File}
	})
	s.RunNode(b, "secured", s.Connect(b, broker.RoleNode, "secured", nats.RootCAs(ca.File)), bs...)
	secured := newTurnRig(b, s.F, s.Connect(b, broker.RoleObserver, "watcher", nats.RootCAs(ca.File)), chunks)

	plain.turn(b) // warm up both
	secured.turn(b)
	var plainTime, securedTime time.Duration
	events := 0
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		n := plain.turn(b)
		plainTime += time.Since(start)
		start = time.Now()
		if m := secured.turn(b); m != n {
			b.Fatalf("a secured turn had %d events, a plain one %d", m, n)
		}
		securedTime += time.Since(start)
		events += n
	}
	b.StopTimer()
	plainRate := float64(events) / plainTime.Seconds()
	securedRate := float64(events) / securedTime.Seconds()
	b.ReportMetric(plainRate, "plain-events/s")
	b.ReportMetric(securedRate, "secured-events/s")
	b.ReportMetric(securedRate/plainRate, "ratio")
}

// waitNode waits until f's view of the pool has the node.
func waitNode(tb testing.TB, f *client.Direct, name string) {
	tb.Helper()
	ctx := natstest.Context(tb, 10*time.Second)
	for {
		nodes, _ := f.Nodes(ctx)
		if slices.ContainsFunc(nodes, func(n schemas.NodeRecord) bool { return n.Name == name }) {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("node %s never appeared", name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
