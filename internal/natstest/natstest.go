// Package natstest starts a per-test embedded NATS server with JetStream
// and the fabric's assets, in process, on a free loopback port with its
// store in the test's temp dir. Tests using it can run in parallel.
package natstest

import (
	"context"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
)

// Limits small enough that many test servers fit on one disk.
const testMaxBytes = 256 << 20

// Start runs a broker for the test and shuts it down when the test ends
// (and the brokers Restart put in its place). mutate, when given,
// adjusts the config first.
func Start(tb testing.TB, mutate ...func(*broker.Config)) *broker.Broker {
	tb.Helper()
	b := start(tb, mutate...)
	tb.Cleanup(func() {
		for s := b; s != nil; {
			s.Shutdown()
			restarted.Lock()
			next := restarted.as[s]
			delete(restarted.as, s)
			restarted.Unlock()
			s = next
		}
	})
	return b
}

// restarted is the broker Restart started in place of each it stopped.
var restarted = struct {
	sync.Mutex
	as map[*broker.Broker]*broker.Broker
}{as: map[*broker.Broker]*broker.Broker{}}

func start(tb testing.TB, mutate ...func(*broker.Config)) *broker.Broker {
	tb.Helper()
	cfg := broker.Config{
		Port:     -1,
		StoreDir: tb.TempDir(),
		Assets:   broker.Assets{MaxBytes: testMaxBytes, NodeTTL: 2 * time.Second},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	b, err := broker.New(cfg)
	if err != nil {
		tb.Fatalf("natstest: configure broker: %v", err)
	}
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		tb.Fatalf("natstest: start broker: %v", err)
	}
	return b
}

// Connect opens a client connection to b over its TCP listener, closed
// when the test ends.
func Connect(tb testing.TB, b *broker.Broker, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(b.ClientURL(), opts...)
	if err != nil {
		tb.Fatalf("natstest: connect to %s: %v", b.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream handle on a fresh connection to b.
func JetStream(tb testing.TB, b *broker.Broker) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc := Connect(tb, b)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// Context returns a context that ends with the test or after d.
func Context(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), d)
	tb.Cleanup(cancel)
	return ctx
}

// Restart stops b, which Start (or Restart) started, as a server that
// goes away does, and starts another on the same port and store dir,
// with the same mutations Start was given (the port and store are b's
// whatever they say). The clients connected to b over TCP see their
// connection drop and, if they reconnect, find the new server where the
// old one was. The new server is shut down when Start's would have been:
// after what the test started on the old one has stopped.
func Restart(tb testing.TB, b *broker.Broker, mutate ...func(*broker.Config)) *broker.Broker {
	tb.Helper()
	u, err := url.Parse(b.ClientURL())
	if err != nil {
		tb.Fatalf("natstest: the broker's URL %q: %v", b.ClientURL(), err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		tb.Fatalf("natstest: the broker's port in %q: %v", b.ClientURL(), err)
	}
	dir := b.StoreDir()
	b.Shutdown()
	next := start(tb, append(mutate, func(c *broker.Config) { c.Port, c.StoreDir = port, dir })...)
	restarted.Lock()
	restarted.as[b] = next
	restarted.Unlock()
	return next
}
