package bridge

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/shoalfabric/shoal/internal/kaimonsub"
)

// zmq4 greets each peer in its accept loop, one after another: five
// connections that never greeted kept a new subscriber out five times
// the handshake's time limit (an outside test held the bus shut to
// newcomers this way, a silent connection every 10 s). Silent peers take
// nobody's turn: a real libzmq subscriber (Kaimon's) connecting after
// them gets what the bus publishes while they wait out their time. Not
// parallel: it lengthens the handshake's time limit.
func TestSilentPeersKeepNoSubscriberOut(t *testing.T) {
	defer func(d time.Duration) { handshakeTimeout = d }(handshakeTimeout)
	handshakeTimeout = 10 * time.Minute
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pub := zmq4.NewPub(withPeers(ctx, peers{log: slog.New(slog.DiscardHandler)}))
	defer pub.Close()
	if err := pub.Listen(batchAddress("tcp://" + addr)); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	sub := kaimonsub.Start(t, "tcp://"+addr)
	payload := JuliaNamedTuple("agent:x", `{"kind":"status","turn":0,"data":{"status":"idle"}}`, "agent", DefaultJuliaVersion)
	deadline := time.After(time.Minute)
	for {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("agent:x"), payload)); err != nil {
			t.Fatal(err)
		}
		select {
		case m, ok := <-sub:
			if !ok {
				t.Fatal("the subscriber exited")
			}
			if m.Ready {
				continue
			}
			if m.Error != "" || !strings.Contains(m.Data, `"idle"`) {
				t.Fatalf("the subscriber got %+v", m)
			}
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("a subscriber connecting after five silent peers got nothing in a minute (each silent peer has ten)")
		}
	}
}
