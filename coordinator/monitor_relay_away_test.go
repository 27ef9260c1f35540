package coordinator_test

import (
	"encoding/json"
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

// Confined nodes write their heartbeats through the relay, and one
// node's flood of its own relay subjects had the server cut the relay's
// connection as a slow consumer, again and again: every confined node's
// entry expired, and the monitor closed every agent of a node that had
// done nothing. An entry written through the relay that expires while
// the relay's connection is away (or within a TTL of its loss) takes no
// node for lost; the node has the grace period, once the relay is back,
// to check in again, and one that never does is lost then. A node that
// writes its own heartbeats is judged as ever.
func TestMonitorTakesNoNodeForLostWhileTheRelayIsAway(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		relayed   bool // the node beats through the relay
		relayAway bool
		beatsMore bool // the node checks in again once the relay is back
		wantDead  bool
	}{
		{"the relay up", true, false, false, true},
		{"the relay away, the node back after it", true, true, true, false},
		{"the relay away, the node never back", true, true, false, true},
		{"the relay away, a node beating on its own", false, true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const ttl, grace = 2 * time.Second, 3 * time.Second
			b := natstest.Start(t, func(c *broker.Config) { c.Assets.NodeTTL = ttl })
			f := newCloseFabricOn(t, b)
			beat := f.n1Beat(t, c.relayed)
			live := f.lostMidTurn("a1")
			putJSON(t, f.agents, "a1", live)

			var mu sync.Mutex
			var lost time.Time
			var away bool
			relay := func() (time.Time, bool) {
				mu.Lock()
				defer mu.Unlock()
				return lost, away
			}
			m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: f.nc, Grace: grace, Relay: relay})
			if err != nil {
				t.Fatal(err)
			}
			fabrictest.Run(t, m)
			if err := beat(); err != nil { // heard from since the monitor started
				t.Fatal(err)
			}
			if c.relayAway {
				mu.Lock()
				lost, away = time.Now(), true
				mu.Unlock()
			}
			dead := func() bool { return f.a1Dead(t) }
			// The entry expires (no beat for the TTL); the relay comes
			// back a moment after.
			time.Sleep(ttl + time.Second)
			mu.Lock()
			away = false
			mu.Unlock()
			if c.beatsMore {
				defer keepBeating(t, beat, ttl)() // and goes on beating
			}
			if c.wantDead {
				poll.Until(t, 30*time.Second, "the agent of a lost node to be closed", dead)
				return
			}
			end := time.Now().Add(ttl + 2*grace)
			for time.Now().Before(end) {
				if dead() {
					t.Fatal("the agent of a node that was away only while the relay was, and checked in again after it, was closed")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// n1Beat writes node n1's heartbeat entry (said written through the
// relay when relayed) each time it is called.
func (f *closeFabric) n1Beat(t *testing.T, relayed bool) func() error {
	t.Helper()
	nodes, err := f.js.KeyValue(t.Context(), schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	return func() error {
		now := float64(time.Now().Unix())
		b, _ := json.Marshal(schemas.NodeRecord{Name: "n1", Instance: "i1", Labels: map[string]string{}, Backends: []schemas.BackendInfo{}, StartedAt: now, Heartbeat: now, Relayed: relayed})
		_, err := nodes.Put(t.Context(), "n1", b)
		return err
	}
}

// keepBeating beats now and every half TTL after, until the function it
// returns is called.
func keepBeating(t *testing.T, beat func() error, ttl time.Duration) (stop func()) {
	t.Helper()
	if err := beat(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var beating sync.WaitGroup
	beating.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(ttl / 2):
				beat()
			}
		}
	})
	return func() { close(done); beating.Wait() }
}

// a1Dead reports whether agent a1's record says it is dead.
func (f *closeFabric) a1Dead(t *testing.T) bool {
	e, err := f.agents.Get(t.Context(), "a1")
	var rec schemas.AgentRecord
	return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
}
