package coordinator_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/netproxy"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The relay's connection lost again and again while a confined node
// streams a turn of 20000 chunks: the stream holds each of them once, in
// order, gapless. Two ways: reset every 30 ms through a TCP proxy; and
// held still for 15 ms (the relay's forwards sit in the proxy, their
// acknowledgements do not come) and then reset, what was held lost, as
// when the server drops a connection with what it has not read of it.
func TestRelayLosesNoEventWhenItsConnectionIsCut(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		held time.Duration
	}{{"reset", 0}, {"held then reset", 15 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			relayLosesNoEvent(t, c.held)
		})
	}
}

// relayLosesNoEvent runs a turn of 20000 chunks through a relay whose
// connection is cut every 30 ms, after being held still for held.
func relayLosesNoEvent(t *testing.T, held time.Duration) {
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, func(c *broker.Config) { c.Auth = auth })
	proxy := netproxy.Start(t, b.ClientURL())
	creds, err := auth.Issue(broker.RoleCoordinator, "relay", 0)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "relay.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	relayConn, err := nats.Connect(proxy.URL(), nats.UserCredentials(credsFile), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayConn.Close)
	// The doors the relay hears nodes on reach the server straight: only
	// the connection the relay forwards on is lost.
	fabrictest.Relay(t, relayConn, func(c *coordinator.RelayConfig) {
		c.Dial = func(name string) (*nats.Conn, error) {
			return nats.Connect(b.ClientURL(), nats.Name(name), nats.UserCredentials(credsFile), nats.MaxReconnects(-1))
		}
	})
	coord, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	f, err := client.NewDirect(coord, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &fabrictest.Secured{B: b, Auth: auth, F: f, Coord: coord}
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 3*time.Minute)
	if _, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() {
		_, err := f.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "stream 20000"})
		ran <- err
	}()
	// Cut once the turn is under way: its start reads the agent's budgets
	// through the relay, and a relay cut every 30 ms from the first
	// moment could leave that read no answer for its whole deadline on a
	// loaded machine (it did, in CI), which is not what this tests.
	poll.Until(t, time.Minute, "the turn under way", func() bool {
		select {
		case err := <-ran:
			ran <- err
			return true
		default:
		}
		return len(storedNumbers(t, ctx, s, "pal")) >= 50
	})
	cuts := 0
	for done := false; !done; {
		select {
		case err := <-ran:
			if err != nil {
				t.Fatalf("a turn of 20000 chunks: %v", err)
			}
			done = true
		case <-time.After(30 * time.Millisecond):
			if held > 0 {
				proxy.Freeze()
				time.Sleep(held)
			}
			proxy.Cut()
			proxy.Thaw() // what the proxy held is written to closed connections: lost
			cuts++
			time.Sleep(20 * time.Millisecond)
			proxy.Restore()
		}
	}
	t.Logf("the relay's connection was cut %d times during the turn", cuts)
	if cuts < 3 {
		t.Fatalf("the turn ended before the relay's connection was cut three times (%d)", cuts)
	}
	var stored []uint64
	poll.Until(t, 2*time.Minute, "the turn's chunks all stored", func() bool {
		stored = storedNumbers(t, ctx, s, "pal")
		if len(stored) > 0 && stored[len(stored)-1] > 20000 {
			return true
		}
		t.Logf("%d events of agent pal stored, the last numbered %v", len(stored), stored[max(len(stored)-1, 0):])
		return false
	})
	for i, got := range stored {
		if got != uint64(i+1) {
			t.Fatalf("the stream holds event %d of agent pal at place %d (of %d, the last numbered %d): a gap or a disorder left by the relay's lost connection", got, i+1, len(stored), stored[len(stored)-1])
		}
	}
}
