// Package fabrictest runs the parts of a fabric in process for tests: a
// node on a test broker, and the coordinator's services, each stopped and
// waited for when the test ends.
package fabrictest

import (
	"bytes"
	"context"
	_ "embed"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/schematest"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
)

// Node runs a node on srv, in process, until the test ends; cfg.Conn and
// cfg.Dir are filled in when empty.
func Node(tb testing.TB, srv *broker.Broker, cfg node.Config) *node.Host {
	tb.Helper()
	if cfg.Conn == nil {
		cfg.Conn = natstest.Connect(tb, srv)
	}
	if cfg.Dir == "" {
		cfg.Dir = tb.TempDir()
	}
	h, err := node.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("node %s: %v", cfg.Name, err)
		}
	})
	select {
	case <-h.Ready():
	case err := <-done:
		done <- err // for the cleanup, which waits for it
		tb.Fatalf("node %s did not start: %v", cfg.Name, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("node %s not ready", cfg.Name)
	}
	return h
}

// Service is one of the coordinator's services.
type Service interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// Run runs s until the test ends, and returns once it is ready.
func Run(tb testing.TB, s Service) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("%T: %v", s, err)
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		done <- err // for the cleanup, which waits for it
		tb.Fatalf("%T did not start: %v", s, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("%T not ready", s)
	}
}

// FabricService runs the coordinator's fabric service on nc, doing its
// work with f, until the test ends.
func FabricService(tb testing.TB, nc *nats.Conn, f *client.Direct) {
	tb.Helper()
	s, err := coordinator.NewService(coordinator.ServiceConfig{Conn: nc, Client: f, Version: "0.0.0-test"})
	if err != nil {
		tb.Fatal(err)
	}
	Run(tb, s)
}

// Relay runs the coordinator's relay on nc until the test ends; each of
// mutate changes its configuration first. It hears each node on a door
// of its own, dialled as nc was (to nc's server, with nc's credentials),
// as the coordinator's relay does.
func Relay(tb testing.TB, nc *nats.Conn, mutate ...func(*coordinator.RelayConfig)) {
	tb.Helper()
	cfg := coordinator.RelayConfig{Conn: nc, Dial: func(name string) (*nats.Conn, error) {
		o := nc.Opts
		o.Name = name
		// Not nc's handlers: a test watching nc must not hear of doors.
		o.DisconnectedErrCB, o.DisconnectedCB, o.ReconnectedCB, o.ClosedCB, o.AsyncErrorCB = nil, nil, nil, nil, nil
		return o.Connect()
	}}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := coordinator.NewRelay(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	Run(tb, r)
}

// Monitor runs the node-loss monitor on nc until the test ends.
func Monitor(tb testing.TB, nc *nats.Conn, grace time.Duration) {
	tb.Helper()
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: grace})
	if err != nil {
		tb.Fatal(err)
	}
	Run(tb, m)
}

//go:embed testdata/turn.jsonl
var turn []byte

// TurnEnvelopes are the envelopes of one recorded claude turn, each
// checked against the event schema.
func TurnEnvelopes(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, l := range bytes.Split(bytes.TrimSpace(turn), []byte("\n")) {
		schematest.Event(tb, l)
		out = append(out, l)
	}
	return out
}
