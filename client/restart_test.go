package client_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The fabric's view of its nodes (WatchNodes, what placement reads in
// shoal up) outlives a restart of the NATS server under it: a node that
// goes quiet just after the restart leaves the list when its entry
// expires, and one that heartbeats after it joins the list. Entries live
// 2s (natstest's node TTL), and so do the markers their expiry leaves:
// the watch must be back within that, not whenever nats.go's watch
// misses its heartbeats (10 to 20 seconds).
func TestWatchNodesAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := natstest.Connect(t, b, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WatchNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	beat := func(b *broker.Broker, name string) {
		t.Helper()
		_, js := natstest.JetStream(t, b)
		nodes, err := js.KeyValue(t.Context(), schemas.NodesBucket)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := json.Marshal(schemas.NodeRecord{Name: name, Instance: "life1"})
		if _, err := nodes.Put(t.Context(), name, v); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(name string) bool {
		nodes, err := f.Nodes(t.Context())
		return err == nil && slices.ContainsFunc(nodes, func(n schemas.NodeRecord) bool { return n.Name == name })
	}
	beat(b, "quiet")
	poll.Until(t, 10*time.Second, "the node is listed", func() bool { return listed("quiet") })

	b = natstest.Restart(t, b)
	poll.Until(t, 30*time.Second, "the connection is back", func() bool { return nc.IsConnected() && nc.Stats().Reconnects > 0 })
	poll.Until(t, 30*time.Second, "the quiet node leaves the list", func() bool { return !listed("quiet") })
	last := time.Time{}
	poll.Until(t, 30*time.Second, "a node heartbeating after the restart is listed", func() bool {
		if time.Since(last) > 500*time.Millisecond {
			last = time.Now()
			beat(b, "alive")
		}
		return listed("alive")
	})
}
