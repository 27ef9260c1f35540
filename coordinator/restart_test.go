package coordinator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The coordinator's services run on connections to a NATS server that
// may restart under them (shoal up --nats, a cluster's member): they
// connect again, as shoal up's do, and their watches of the buckets must
// go on. Each test below restarts the server (same port, same store)
// while the service under test runs, then changes the bucket it watches.

// outliving is a connection of a coordinator's service to b, connecting
// again for ever as shoal up's connections to an external NATS do.
func outliving(t *testing.T, b *broker.Broker) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, b, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
}

// restart restarts b and returns the new server once every connection
// in conns is connected to it.
func restart(t *testing.T, b *broker.Broker, conns ...*nats.Conn) *broker.Broker {
	t.Helper()
	b = natstest.Restart(t, b)
	for _, nc := range conns {
		poll.Until(t, 30*time.Second, "the service's connection is back", func() bool {
			return nc.IsConnected() && nc.Stats().Reconnects > 0
		})
	}
	return b
}

func putJSON(t *testing.T, kv jetstream.KeyValue, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), key, b); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func buckets(t *testing.T, b *broker.Broker) (nodes, agents jetstream.KeyValue) {
	t.Helper()
	_, js := natstest.JetStream(t, b)
	var err error
	if nodes, err = js.KeyValue(t.Context(), schemas.NodesBucket); err != nil {
		t.Fatal(err)
	}
	if agents, err = js.KeyValue(t.Context(), schemas.AgentsBucket); err != nil {
		t.Fatal(err)
	}
	return nodes, agents
}

// A node heard from before the server restarted heartbeats once more
// after it, then goes quiet: the node-loss monitor, which stayed up,
// still takes it for lost and marks its agent dead. The node's entry
// lives 2s (natstest's node TTL), and so does the marker its expiry
// leaves: the monitor must be watching again within that, not whenever
// nats.go's watch misses its heartbeats (10 to 20 seconds).
func TestMonitorFindsALossAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := outliving(t, b)
	// A grace longer than the test: only the watch can find the loss,
	// not the sweep of nodes never heard from.
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	nodes, agents := buckets(t, b)
	putJSON(t, agents, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, EventLog: "a1.jsonl", CreatedAt: float64(time.Now().Unix())})
	putJSON(t, nodes, "n1", schemas.NodeRecord{Name: "n1", Instance: "life1"})

	b = restart(t, b, nc)
	nodes, agents = buckets(t, b)
	putJSON(t, nodes, "n1", schemas.NodeRecord{Name: "n1", Instance: "life1"}) // its last heartbeat
	poll.Until(t, 30*time.Second, "the quiet node's agent is dead", func() bool {
		e, err := agents.Get(t.Context(), "a1")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
	})
}

// The relay's view of the agents (who owns each, its status) follows
// records written after the server restarted.
func TestRelayFollowsAgentsAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := outliving(t, b)
	r, err := coordinator.NewRelay(coordinator.RelayConfig{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, r)
	_, agents := buckets(t, b)
	putJSON(t, agents, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle})
	poll.Until(t, 10*time.Second, "the relay sees the agent", func() bool { return r.AgentsByStatus()[schemas.StatusIdle] == 1 })

	b = restart(t, b, nc)
	_, agents = buckets(t, b)
	putJSON(t, agents, "a2", schemas.AgentRecord{ID: "a2", Node: "n1", Status: schemas.StatusWorking})
	poll.Until(t, 30*time.Second, "the relay sees the agent written after the restart", func() bool {
		return r.AgentsByStatus()[schemas.StatusWorking] == 1
	})
}

// The ledger follows the nodes' entries after the server restarted: a
// node's new life, written then, retires the rows of its earlier one.
func TestLedgerFollowsNodesAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	r := newLedgerRig(t)
	r.node("n1", "life1", nil)
	nc := outliving(t, r.srv)
	l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, l)
	r.turn("a1", "n1", 100, 20)
	poll.Until(t, 10*time.Second, "the turn is counted", func() bool { return l.Spent().Counted("n1", "life1").InputTokens == 100 })

	r.srv = restart(t, r.srv, nc)
	r.nc, r.js = natstest.JetStream(t, r.srv)
	// A node heartbeats, as it does after the restart; each of its
	// entries lives 2s.
	beat := time.Now()
	r.node("n1", "life2", nil)
	poll.Until(t, 30*time.Second, "the ledger retires the node's earlier life", func() bool {
		if time.Since(beat) > 500*time.Millisecond {
			beat = time.Now()
			r.node("n1", "life2", nil)
		}
		return l.Spent().Counted("n1", "life1") == schemas.Usage{}
	})
}
