package coordinator_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// An open's claim that no node took up (its caller went before the node
// heard of it) was listed as starting for good while its node lived: only
// a node's loss, or a close of the id, ended it. The monitor ends a
// claim older than any open would take, whatever its node; a claim of an
// open under way is left.
func TestMonitorForgetsAClaimNoNodeTookUp(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := t.Context()
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(id string, at time.Time) {
		rec, _ := json.Marshal(schemas.AgentRecord{ID: id, Node: "alive", Status: schemas.StatusStarting, CreatedAt: float64(at.Unix())})
		if _, err := agents.Put(ctx, id, rec); err != nil {
			t.Fatal(err)
		}
	}
	claim("stale", time.Now().Add(-schemas.OpenTimeout-2*time.Minute))
	claim("fresh", time.Now())
	// A stale claim of an id with earlier lives carries where their
	// numbering ended and what they used: it is written dead, and the
	// id's next open carries them on from it.
	lived, _ := json.Marshal(schemas.AgentRecord{ID: "lived", Node: "alive", Status: schemas.StatusStarting,
		CreatedAt: float64(time.Now().Add(-schemas.OpenTimeout - 2*time.Minute).Unix()), EventsBefore: 40, TurnsBefore: 3})
	if _, err := agents.Put(ctx, "lived", lived); err != nil {
		t.Fatal(err)
	}
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: time.Hour, ClaimsEvery: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	poll.Until(t, 30*time.Second, "the stale claim to go", func() bool {
		_, err := agents.Get(ctx, "stale")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	time.Sleep(time.Second) // a few more rounds
	if _, err := agents.Get(ctx, "fresh"); err != nil {
		t.Errorf("the claim of an open under way: %v", err)
	}
	e, err := agents.Get(ctx, "lived")
	var rec schemas.AgentRecord
	if err == nil {
		err = json.Unmarshal(e.Value(), &rec)
	}
	if events, turns := rec.NextNumbers(); err != nil || rec.Status != schemas.StatusDead || events != 40 || turns != 3 {
		t.Errorf("the stale claim of an id that lived: %+v %v; want it dead, numbering on from event 40 and turn 3", rec, err)
	}
}
