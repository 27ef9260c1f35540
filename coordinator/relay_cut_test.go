package coordinator_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/netproxy"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The relay's connection cut again and again (every 30 ms, through a TCP
// proxy, the connection reset) while a confined node streams a turn of
// 20000 chunks: the stream holds each of them once, in order, gapless.
// (An outside review saw gaps when the server cut the relay's connection
// as a slow consumer under a flood; this does not reproduce that case.)
func TestRelayLosesNoEventWhenItsConnectionIsCut(t *testing.T) {
	t.Parallel()
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
	fabrictest.Relay(t, relayConn)
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
	cuts := 0
	for done := false; !done; {
		select {
		case err := <-ran:
			if err != nil {
				t.Fatalf("a turn of 20000 chunks: %v", err)
			}
			done = true
		case <-time.After(30 * time.Millisecond):
			proxy.Cut()
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
	poll.Until(t, 2*time.Minute, "the turn's events all stored", func() bool {
		stored = storedNumbers(t, ctx, s, "pal")
		return len(stored) > 20000 && stored[len(stored)-1] == uint64(len(stored))
	})
	for i, got := range stored {
		if got != uint64(i+1) {
			t.Fatalf("the stream holds event %d of agent pal at place %d: a gap left by the relay's lost connection", got, i+1)
		}
	}
}
