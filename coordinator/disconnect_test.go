package coordinator_test

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A node restarted under its name (a service manager after a crash) is
// connected, under schemas.NodeConnName, for the whole of its start
// (hello, journal resume reading the stream, reconcile, serve) before it
// writes its first heartbeat. The monitor's sweep of its earlier life's
// records, when the grace after a coordinator restart ended in that
// window, closed every connection of that name: the new, healthy
// process's too, failing whatever step of its start was in flight
// (ReconnectBufSize -1: a request made while it reconnects fails at
// once). Only the connections made before the lost node's last heartbeat
// are closed, and none after a start's grace.
func TestMonitorDoesNotKickANewLifeOfALostNode(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	mc := outliving(t, b)
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: mc, Grace: time.Second, Disconnect: b.DisconnectNode})
	if err != nil {
		t.Fatal(err)
	}
	_, agents := buckets(t, b)
	// n1's earlier life: a live record, its entry gone with the crash.
	putJSON(t, agents, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, EventLog: "a1.jsonl", CreatedAt: float64(time.Now().Unix())})

	// n1's new life, starting: connected as cmd/shoal connects a node.
	var kicked atomic.Int32
	nc := natstest.Connect(t, b, nats.Name(schemas.NodeConnName("n1", "life2")), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { kicked.Add(1) }))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	poll.Until(t, 30*time.Second, "the earlier life's agent is closed", func() bool {
		e, err := agents.Get(t.Context(), "a1")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
	})
	if n := kicked.Load(); n > 0 {
		t.Errorf("closing the dead life's agent disconnected the new, starting node n1 (%d times): a request of its start made then fails", n)
	}
}

// A node heard from, then lost (its entry expires): the connections of
// its life (the instance its heartbeat names) are closed before its
// agents are, and what they held is dropped with them, however lately
// made: one made again within its lease (a reconnect after its last
// heartbeat) was left, and what it held was stored after the
// coordinator's close. One of a new life starting under its name, another
// instance, is left.
func TestMonitorKicksOnlyTheLostLifesConnections(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	mc := outliving(t, b)
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: mc, Grace: time.Hour, Disconnect: b.DisconnectNode})
	if err != nil {
		t.Fatal(err)
	}
	nodes, agents := buckets(t, b)
	fabrictest.Run(t, m)
	connect := func(name string) *atomic.Int32 {
		var kicked atomic.Int32
		nc := natstest.Connect(t, b, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.ReconnectBufSize(-1),
			nats.DisconnectErrHandler(func(*nats.Conn, error) { kicked.Add(1) }))
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return &kicked
	}
	oldKicked := connect(schemas.NodeConnName("n1", "life1"))
	putJSON(t, agents, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, EventLog: "a1.jsonl", CreatedAt: float64(time.Now().Unix())})
	putJSON(t, nodes, "n1", schemas.NodeRecord{Name: "n1", Instance: "life1"})
	time.Sleep(10 * time.Millisecond) // the server's clock moves past the heartbeat
	againKicked := connect(schemas.NodeConnName("n1", "life1") + " (events)")
	newKicked := connect(schemas.NodeConnName("n1", "life2"))
	olderKicked := connect("shoal node n1")                // a node of an earlier version, connected after the beat
	if err := nodes.Purge(t.Context(), "n1"); err != nil { // its entry gone: n1 is lost
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the lost node's agent is closed", func() bool {
		e, err := agents.Get(t.Context(), "a1")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
	})
	if oldKicked.Load() == 0 {
		t.Error("the lost life's connection, made before its last heartbeat, was left open")
	}
	if againKicked.Load() == 0 {
		t.Error("the lost life's events connection, made again after its last heartbeat, was left open")
	}
	if n := newKicked.Load(); n > 0 {
		t.Errorf("a connection of n1's new life was closed (%d times)", n)
	}
	if n := olderKicked.Load(); n > 0 {
		t.Errorf("a connection named as an earlier version names n1's, made after its last heartbeat, was closed (%d times)", n)
	}
}
