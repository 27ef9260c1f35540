package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/schemas"
)

// TestFleetPlacesOverRegisteredNodes registers 20 fake nodes on an
// embedded server, beating every 100ms, and opens 100 agents through
// placement: every open succeeds and is timed, placement spreads them
// over more than one node, the heartbeats' load was seen on the server,
// and the run leaves no record and no goroutine behind.
func TestFleetPlacesOverRegisteredNodes(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := embedded(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()

	rep, err := Fleet(ctx, FleetConfig{URL: b.ClientURL(), Nodes: 20, Opens: 100, Beat: 100 * time.Millisecond, Progress: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *rep)
	switch {
	case rep.NodesRegistered != 20:
		t.Errorf("%d nodes registered, want 20", rep.NodesRegistered)
	case rep.Opens != 100 || rep.Placement.Samples != 100:
		t.Errorf("%d opens, %d timed; want 100 of each", rep.Opens, rep.Placement.Samples)
	case rep.NodesUsed < 2 || rep.MaxOpensPerNode >= 100:
		t.Errorf("placement used %d nodes (at most %d opens on one), want more than one", rep.NodesUsed, rep.MaxOpensPerNode)
	case rep.Heartbeat.Puts == 0 || rep.Heartbeat.MsgsPerSec <= 0 || rep.Heartbeat.BytesInPerSec <= 0 || rep.Heartbeat.BytesOutPerSec <= 0:
		t.Errorf("no heartbeat load measured: %+v", rep.Heartbeat)
	case rep.Heartbeat.WatchMsgsPerSec <= 0:
		t.Errorf("the follower of the nodes bucket received no beats: %+v", rep.Heartbeat)
	case rep.HeartbeatInterval != 100:
		t.Errorf("heartbeat interval %vms, want 100", rep.HeartbeatInterval)
	}
	if rep.Placement.P50 <= 0 || rep.Placement.P99 < rep.Placement.P50 || rep.Placement.Max < rep.Placement.P99 {
		t.Errorf("placement latency out of order: %+v", rep.Placement)
	}

	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []string{schemas.NodesBucket, schemas.AgentsBucket} {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if !errors.Is(err, jetstream.ErrNoKeysFound) {
			t.Errorf("KV bucket %s after the run: keys %v (%v), want none", bucket, keys, err)
		}
	}
}

// TestFleetRefusesABeatThatOutlivesTheRecord checks that a heartbeat
// interval no shorter than the nodes bucket's TTL is refused before any
// node starts.
func TestFleetRefusesABeatThatOutlivesTheRecord(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := embedded(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if _, err := Fleet(ctx, FleetConfig{URL: b.ClientURL(), Nodes: 1, Beat: time.Hour}); err == nil {
		t.Fatal("a heartbeat of an hour was accepted")
	}
}

// testLog writes the run's progress lines to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", b)
	return len(b), nil
}
