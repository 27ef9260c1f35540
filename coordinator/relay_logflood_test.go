package coordinator_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node naming thousands of made-up agents has each of its events
// refused, and the coordinator's log says so a bounded number of times,
// then how many it did not say, not a line per made-up agent (an outside
// review filled 23 MB of log in 30 s this way). Another node's first
// refusal is logged all the same.
func TestRelayLogsANodesRefusalsBounded(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	ctx := natstest.Context(t, 2*time.Minute)
	flood := func(node string, n int) {
		nc := s.Connect(t, broker.RoleNode, node)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		var acks []jetstream.PubAckFuture
		for i := range n {
			id := fmt.Sprintf("made-up-%d", i)
			m := nats.NewMsg(schemas.RelaySubject(node, schemas.RelayEvent, id))
			m.Data = []byte(`{"kind":"error","turn":1,"data":{"message":"forged","data":null}}`)
			m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, 1))
			m.Header.Set(schemas.HeaderNode, node)
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, f)
		}
		for i, f := range acks {
			select {
			case <-f.Ok():
				t.Fatalf("node %s's event of made-up agent %d was stored", node, i)
			case <-f.Err():
			case <-ctx.Done():
				t.Fatalf("node %s's event %d: no answer", node, i)
			}
		}
	}
	flood("evil", 3000)
	flood("other", 1)
	lines := strings.Count(logs.String(), "refused a node's write")
	if lines > 50 {
		t.Errorf("the relay logged %d refusals of node evil's writes for 3000 made-up agents; want a bounded few", lines)
	}
	if !strings.Contains(logs.String(), "node=other") {
		t.Errorf("node other's refusal was not logged:\n%s", logs.String())
	}
	// The count of what was not said comes with the next refusal after
	// the minute; here, within it, the log says they are being held back.
	if !strings.Contains(logs.String(), "more refusals of the node's writes are not logged") {
		t.Errorf("the log does not say refusals of node evil's writes were held back:\n%.2000s", logs.String())
	}
}
