package coordinator_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator held up past the nodes' TTL (its process stopped, its
// machine asleep: its embedded server with it, so no node could beat)
// woke to entries expiring and took living nodes for lost, closing every
// agent of theirs, whenever their expiry came before their next beat. A
// monitor that finds it was held up a TTL or longer gives every node the
// grace period, as at a start: the node that beats again within it keeps
// its agents; one that never does is lost at its end. Held up less than a
// TTL, an expiry is judged as ever.
func TestMonitorHeldUpGivesTheNodesTheGracePeriod(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		held      time.Duration
		beatsMore bool
		wantDead  bool
	}{
		{"not held", 0, true, true},
		{"held past the TTL, the node back", 10 * time.Second, true, false},
		{"held past the TTL, the node never back", 10 * time.Second, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const ttl, grace = 2 * time.Second, 3 * time.Second
			b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = ttl })
			f := newCloseFabricOn(t, b)
			beat := f.n1Beat(t, false)
			putJSON(t, f.agents, "a1", f.lostMidTurn("a1"))
			var mu sync.Mutex
			var ahead time.Duration // how far the monitor's clock jumped
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return time.Now().Add(ahead)
			}
			m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: f.nc, Grace: grace, Now: clock})
			if err != nil {
				t.Fatal(err)
			}
			fabrictest.Run(t, m)
			if err := beat(); err != nil { // heard from since the monitor started
				t.Fatal(err)
			}
			// The node's beats stop; the monitor finds, at its next look,
			// that it was held up.
			mu.Lock()
			ahead = c.held
			mu.Unlock()
			dead := func() bool { return f.a1Dead(t) }
			time.Sleep(ttl + time.Second) // the entry expires
			if c.beatsMore {
				defer keepBeating(t, beat, ttl)()
			}
			if c.wantDead {
				poll.Until(t, 30*time.Second, "the agent of a lost node to be closed", dead)
				return
			}
			for end := time.Now().Add(ttl + 2*grace); time.Now().Before(end); {
				if dead() {
					t.Fatal("the agent of a node whose entry expired while the monitor was held up, and that beat again after, was closed")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// The monitor looks each second, and with a TTL of one second (the least
// the broker takes) about every other look came a TTL after the one
// before: it took itself for held up each time and gave every node the
// grace period again, so a lost node's agent was closed late or never. A
// gap counts as held up only past a TTL and a second.
func TestMonitorWithAOneSecondTTLIsNotHeldUp(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = ttl })
	f := newCloseFabricOn(t, b)
	nodes, err := f.js.KeyValue(t.Context(), schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	putJSON(t, f.agents, "a1", f.lostMidTurn("a1"))
	now := float64(time.Now().Unix())
	rec, _ := json.Marshal(schemas.NodeRecord{Name: "n1", Instance: "i1", Labels: map[string]string{}, Backends: []schemas.BackendInfo{}, StartedAt: now, Heartbeat: now})
	if _, err := nodes.Put(t.Context(), "n1", rec); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: f.nc, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m) // n1, written before, never beats again: lost at the grace period's end (3 s)
	poll.Until(t, 15*time.Second, "the lost node's agent to be closed about the grace period's end", func() bool {
		e, err := f.agents.Get(t.Context(), "a1")
		var r schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &r) == nil && r.Status == schemas.StatusDead
	})
	if n := strings.Count(logs.String(), "held up"); n > 1 {
		t.Errorf("a monitor never held up said it was, %d times:\n%s", n, logs.String())
	}
}
