package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
)

// syncBuffer is a log a test reads while others write it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// breakConn makes the server close nc for good, as it does for a client
// that breaks the protocol: a subject longer than its control line.
func breakConn(t *testing.T, nc *nats.Conn) {
	t.Helper()
	nc.Publish(strings.Repeat("a", 5000), nil)
	nc.Flush()
	poll.Until(t, 10*time.Second, "the server to close the connection", nc.IsClosed)
}

// The MCP endpoint's client connects again when the server closes its
// connection, and the log says so: a request after it is answered.
func TestRedialingClientConnectsAgain(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	var logged syncBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, err := newRedialing(ctx, "shoal-mcp", func(name string) (*nats.Conn, error) { return b.Connect(nats.Name(name)) }, log)
	if err != nil {
		t.Fatal(err)
	}
	defer r.closeAll()
	breakConn(t, r.Conn())
	if _, err := r.List(ctx); err != nil {
		t.Fatalf("a request after the server closed the connection: %v", err)
	}
	if got := logged.String(); !strings.Contains(got, "the server closed a NATS connection; connected again") || !strings.Contains(got, "connection=shoal-mcp") || !strings.Contains(got, "maximum control line exceeded") {
		t.Errorf("the log says %q", got)
	}
}

// fakeService is a coordinator service that answers on a subject.
type fakeService struct {
	nc    *nats.Conn
	ready chan struct{}
}

func (s *fakeService) Ready() <-chan struct{} { return s.ready }

func (s *fakeService) Run(ctx context.Context) error {
	sub, err := s.nc.Subscribe("svc.ping", func(m *nats.Msg) { m.Respond([]byte("pong")) })
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	s.nc.Flush()
	close(s.ready)
	<-ctx.Done()
	return nil
}

// A coordinator service whose connection the server closes is made again
// on a new one, and the log says so; its outage says when the connection
// was lost and that it is back (the monitor asks the relay's).
func TestSupervisedServiceConnectsAgain(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	var logged syncBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ctx, cancel := context.WithCancel(t.Context())
	conns := make(chan *nats.Conn, 4)
	ready, errc := make(chan error, 1), make(chan error, 1)
	done := make(chan struct{})
	conn := new(outage)
	go func() {
		defer close(done)
		supervise(ctx, "svc", func(name string) (*nats.Conn, error) { return b.Connect(nats.Name(name)) },
			func(nc *nats.Conn) (service, error) {
				conns <- nc
				return &fakeService{nc: nc, ready: make(chan struct{})}, nil
			}, log, ready, errc, conn)
	}()
	defer func() { cancel(); <-done }()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	caller := natstest.Connect(t, b)
	if _, err := caller.Request("svc.ping", nil, 5*time.Second); err != nil {
		t.Fatalf("the service before: %v", err)
	}
	if lost, away := conn.state(); !lost.IsZero() || away {
		t.Fatalf("before any loss the outage says lost %v, away %v", lost, away)
	}
	before := time.Now()
	breakConn(t, <-conns)
	// Its handler, which notes the loss, is called as the connection
	// closes, not before IsClosed says it is.
	poll.Until(t, 10*time.Second, "the outage to note the loss", func() bool {
		lost, _ := conn.state()
		return !lost.Before(before)
	})
	select {
	case <-conns: // made again
	case err := <-errc:
		t.Fatalf("the service failed instead of connecting again: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the service was not made again")
	}
	poll.Until(t, 10*time.Second, "the service to answer again", func() bool {
		_, err := caller.Request("svc.ping", nil, time.Second)
		return err == nil
	})
	if _, away := conn.state(); away {
		t.Error("the service is made again on a new connection; its outage says it is away")
	}
	if got := logged.String(); !strings.Contains(got, "the server closed a service's NATS connection; connecting again") || !strings.Contains(got, "service=svc") {
		t.Errorf("the log says %q", got)
	}
}
