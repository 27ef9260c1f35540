package coordinator_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// Through the fabric service, an agent whose events retention dropped
// every one of (its record numbers five, the stream holds none) reads as
// such: a replay of it ends naming them as a gap, agent_events lists the
// gap and goes on after them, and a replay from its next event is
// nothing, not "past the end".
func TestServiceSaysAnAgentsEventsAllAgedOut(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	then := float64(time.Now().Add(-time.Hour).Unix())
	rec := schemas.AgentRecord{ID: "idle", Node: "n1", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/w", CreatedAt: then, LastActivity: then, EventLog: "idle.jsonl", LastEvent: 5, Turn: 1}
	b, _ := json.Marshal(rec)
	if _, err := agents.Create(ctx, "idle", b); err != nil {
		t.Fatal(err)
	}
	observer, err := client.New(s.Connect(t, broker.RoleObserver, "watcher"), client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	// A record whose close is kept (its events on their way) is not
	// taken for one whose events were dropped.
	closing := rec
	closing.ID, closing.EventLog, closing.Status = "closing", "closing.jsonl", schemas.StatusDead
	closing.Closing = &schemas.Closing{From: 3, Why: "node n1 was lost"}
	b, _ = json.Marshal(closing)
	if _, err := agents.Create(ctx, "closing", b); err != nil {
		t.Fatal(err)
	}
	// A record just written may number events still on their way: the
	// gap is said once it has been quiet a while.
	delivered := 0
	var err2 error
	poll.Until(t, 30*time.Second, "the replay names the dropped events", func() bool {
		err2 = observer.Replay(ctx, []string{"idle"}, client.From{}, false, func(client.Replayed, *client.Gap) error { delivered++; return nil })
		return err2 != nil
	})
	if gap, ok := errors.AsType[client.Gap](err2); !ok || gap != (client.Gap{Agent: "idle", From: 1, To: 5}) || delivered != 0 {
		t.Errorf("a replay of an agent whose five events aged out: %v (%d delivered), want them as a gap", err2, delivered)
	}
	if err := observer.Replay(ctx, []string{"closing"}, client.From{}, false, func(client.Replayed, *client.Gap) error { delivered++; return nil }); err != nil || delivered != 0 {
		t.Errorf("a replay of an agent whose close is on its way: %v (%d delivered), want nothing yet", err, delivered)
	}
	page, err := observer.Events(ctx, schemas.EventsRequest{AgentID: "idle", FromEvent: 3})
	if err != nil || len(page.Gaps) != 1 || page.Gaps[0] != (schemas.EventGap{From: 3, To: 5}) || page.NextEvent != 6 {
		t.Errorf("agent_events from event 3: %+v, %v", page, err)
	}
	if err := observer.Replay(ctx, []string{"idle"}, client.From{Event: 6}, false, func(client.Replayed, *client.Gap) error { delivered++; return nil }); err != nil || delivered != 0 {
		t.Errorf("a replay from the agent's next event: %v (%d delivered)", err, delivered)
	}
}
