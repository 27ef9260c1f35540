package coordinator_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// One node's bytes wait behind its own alone. Node evil, having said
// hello as any node does, sends messages of the largest size the server
// takes on its own relay subjects from four connections at once: before,
// they all came to the relay's one connection, which the server cut as a
// slow consumer again and again, and every confined node's operations
// waited or failed meanwhile. Each node now has a door of its own at the
// relay: node honest's heartbeats and requests are answered throughout,
// each within the nodes' TTL, its entry never lapses, the relay's own
// connection is never cut, and honest's agent lives on. Evil floods its events, then
// the subjects every node's first words come on (hello, beat).
func TestRelayKeepsAByteFloodToItsNode(t *testing.T) {
	t.Parallel()
	for _, op := range []schemas.RelayOp{schemas.RelayEvent, schemas.RelayBeat} {
		t.Run(string(op), func(t *testing.T) {
			t.Parallel()
			const ttl = 3 * time.Second
			s := fabrictest.StartSecured(t, func(c *broker.Config) { c.Assets.NodeTTL = ttl })
			var cuts atomic.Int64
			s.Coord.SetDisconnectErrHandler(func(_ *nats.Conn, err error) { cuts.Add(1) })
			coord, err := s.B.Connect()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(coord.Close)
			fabrictest.Monitor(t, coord, ttl)
			s.StartNode(t, "honest")
			ctx := natstest.Context(t, 90*time.Second)
			if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal", Node: "honest"}); err != nil {
				t.Fatal(err)
			}

			first := s.Connect(t, broker.RoleNode, "evil")
			if _, err := first.Request(schemas.RelaySubject("evil", schemas.RelayHello), nil, 10*time.Second); err != nil {
				t.Fatalf("node evil's hello: %v", err)
			}
			payload := make([]byte, first.MaxPayload()-4096)
			subject := schemas.RelaySubject("evil", op)
			if op == schemas.RelayEvent {
				subject = schemas.RelaySubject("evil", op, "x")
			}
			stop := make(chan struct{})
			var flooders sync.WaitGroup
			var sent atomic.Int64
			for range 4 {
				nc := s.Dial(t, broker.RoleNode, "evil", nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
				inbox := nc.NewInbox()
				flooders.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if nc.PublishMsg(&nats.Msg{Subject: subject, Reply: fmt.Sprintf("%s.%d", inbox, i), Data: payload}) == nil {
							sent.Add(1)
						} else {
							time.Sleep(time.Millisecond)
						}
					}
				})
			}
			defer func() { close(stop); flooders.Wait() }()

			nodes, err := s.F.JetStream().KeyValue(ctx, schemas.NodesBucket)
			if err != nil {
				t.Fatal(err)
			}
			answeredThroughout(t, ctx, s, nodes, ttl, func() string { return fmt.Sprintf(" (the relay's connection cut %d times)", cuts.Load()) })
			if n := cuts.Load(); n > 0 {
				t.Errorf("the relay's own connection was cut %d times by node evil's flood", n)
			}
			// At least twice what the server keeps waiting for a client
			// (64 MiB), which cut the relay's one connection before.
			if n := sent.Load(); n*int64(len(payload)) < 128<<20 {
				t.Errorf("node evil sent only %d messages of %d bytes: no flood", n, len(payload))
			}
			rec, err := s.F.Status(ctx, "pal")
			if err != nil || rec.Status == schemas.StatusDead {
				t.Fatalf("node honest's agent after node evil's flood: %+v %v", rec, err)
			}
		})
	}
}
