package coordinator_test

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// jsAPI counts the requests made to the JetStream API (and its direct
// gets) from here on.
func jsAPI(t *testing.T, b *broker.Broker) *atomic.Int64 {
	t.Helper()
	spy, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spy.Close)
	var n atomic.Int64
	if _, err := spy.Subscribe("$JS.API.>", func(*nats.Msg) { n.Add(1) }); err != nil {
		t.Fatal(err)
	}
	spy.Flush()
	return &n
}

// A node that stops among a thousand dead records (most of a grown
// fabric's): the monitor read every record with a request of its own to
// find the node's agents; it reads them in one pass.
func TestNodeLossReadsTheRecordsInOnePass(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = time.Minute })
	nc := natstest.Connect(t, b)
	js, _ := jetstream.New(nc)
	deadRecords(t, js, "gone", 1000, func(i int) string { return fmt.Sprintf("d%04d", i) })
	ctx := natstest.Context(t, time.Minute)
	nodes, _ := js.KeyValue(ctx, schemas.NodesBucket)
	now := float64(time.Now().Unix())
	rec, _ := json.Marshal(schemas.NodeRecord{Name: "n9", Instance: "i", Labels: map[string]string{}, Backends: []schemas.BackendInfo{}, StartedAt: now, Heartbeat: now})
	if _, err := nodes.Put(ctx, "n9", rec); err != nil {
		t.Fatal(err)
	}
	fabrictest.Monitor(t, nc, time.Hour)
	time.Sleep(300 * time.Millisecond)
	api := jsAPI(t, b)
	if err := nodes.Delete(ctx, "n9"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if got := api.Load(); got > 50 {
		t.Errorf("node n9 (no agents) stopped among 1,000 dead records: the monitor made %d requests of the JetStream API", got)
	}
}
