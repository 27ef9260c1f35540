package coordinator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// The relay's connection for events is closed on every way out of Run:
// when its context ends, and when Run fails after making it (here the
// lobby cannot be dialled); and closing it so closes nothing of its
// caller's, who judges the relay's end by its own connection (an outside
// reader found a failed Run closing it, its error lost to a restart).
func TestRelayClosesItsForwardingConnection(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	t.Run("context ends", func(t *testing.T) {
		nc := natstest.Connect(t, b)
		r, err := NewRelay(RelayConfig{Conn: nc})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		select {
		case <-r.Ready():
		case <-time.After(30 * time.Second):
			t.Fatal("not ready")
		}
		fwd := r.fwd
		cancel()
		<-done
		if fwd == nc {
			t.Fatal("the test connection buffers nothing already")
		}
		if !fwd.IsClosed() {
			t.Error("the forwarding connection is open after Run returned")
		}
		time.Sleep(200 * time.Millisecond)
		if nc.IsClosed() {
			t.Error("the relay closed its caller's connection as it stopped")
		}
	})
	t.Run("run fails", func(t *testing.T) {
		nc := natstest.Connect(t, b)
		r, err := NewRelay(RelayConfig{Conn: nc, Dial: func(string) (*nats.Conn, error) { return nil, errors.New("no lobby") }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "no lobby") {
			t.Errorf("Run without a lobby: %v", err)
		}
		if r.fwd == nil || !r.fwd.IsClosed() {
			t.Error("the forwarding connection is open after Run failed")
		}
		time.Sleep(200 * time.Millisecond)
		if nc.IsClosed() {
			t.Error("Run failed with its context live, and closing its connection for events closed its caller's connection too")
		}
	})
}
