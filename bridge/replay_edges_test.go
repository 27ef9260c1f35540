package bridge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// Retention has dropped turn 1: a replay from turn 1 says so instead of
// skipping ahead to turn 2, the page API (agent_events, shoal.fabric.events)
// too; a replay from turn 2 works; a replay from the start reports the
// events it can no longer show as a gap before the first one it has.
func TestReplayPastRetentionSaysSo(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	f, _ := bridge.NewFabric(natstest.Connect(t, b), bridge.FabricConfig{})
	a := &agentStream{t: t, js: js, id: "trimmed"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	a.turn(1, "first")  // events 2-8
	a.turn(2, "second") // events 9-15
	s, _ := js.Stream(t.Context(), schemas.StreamName)
	if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(10)); err != nil { // events 1-9 are gone
		t.Fatal(err)
	}
	want := "turn 1 of agent trimmed is past the stream's retention; its stored history now starts at event 10, and turn 2 is the first it holds whole"
	var c collected
	if err := f.Replay(t.Context(), []string{"trimmed"}, bridge.From{Turn: 1}, false, c.fn); err == nil || err.Error() != want || len(c.evs) != 0 {
		t.Errorf("replay from a dropped turn: %v, after %v", err, c.numbers())
	}
	if _, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "trimmed", FromTurn: 1}); err == nil || err.Error() != want {
		t.Errorf("a page from a dropped turn: %v", err)
	}
	var kept collected
	if err := f.Replay(t.Context(), []string{"trimmed"}, bridge.From{Turn: 2}, false, kept.fn); err != nil || !equal(kept.numbers(), seq(10, 15)) {
		t.Errorf("replay from a kept turn: %v %v", kept.numbers(), err)
	}
	var all collected
	if err := f.Replay(t.Context(), []string{"trimmed"}, bridge.From{}, false, all.fn); err != nil || !equal(all.numbers(), seq(10, 15)) {
		t.Fatalf("replay from the start: %v %v", all.numbers(), err)
	}
	if len(all.gaps) != 1 || all.gaps[0] != (bridge.Gap{Agent: "trimmed", From: 1, To: 9}) {
		t.Errorf("the dropped start is reported as %+v, want one gap of events 1-9", all.gaps)
	}
	page, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "trimmed"})
	if err != nil || len(page.Gaps) != 1 || page.Gaps[0] != (schemas.EventGap{From: 1, To: 9}) {
		t.Errorf("a page from the start reports gaps %+v (%v)", page.Gaps, err)
	}
	kept.check(t)
	all.check(t)
}

// An observer resuming live from the event after the last it saw, when
// that event is not stored yet, gets it whenever it comes, even when it is
// stored while the replay is being set up.
func TestFollowFromAnEventNotStoredYet(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	f, _ := bridge.NewFabric(natstest.Connect(t, b), bridge.FabricConfig{})
	a := &agentStream{t: t, js: js, id: "resume"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	for trial := range 20 {
		next := a.n + 1
		got := make(chan bridge.Replayed, 4)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- f.Replay(ctx, []string{"resume"}, bridge.From{Event: next}, true, func(r bridge.Replayed, g *bridge.Gap) error {
				if g != nil {
					t.Errorf("trial %d: a gap %+v", trial, *g)
				}
				got <- r
				return nil
			})
		}()
		// Stored at once: sometimes before the replay looks, sometimes
		// while it sets up, sometimes after.
		a.emit(trial, schemas.AssistantText{Delta: true, Content: schemas.Text("x")})
		select {
		case r := <-got:
			if r.N != next {
				t.Errorf("trial %d: first event %d, want %d", trial, r.N, next)
			}
		case err := <-done:
			t.Fatalf("trial %d: the replay ended: %v", trial, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("trial %d: event %d never came", trial, next)
		}
		cancel()
		if err := <-done; err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("trial %d: %v", trial, err)
		}
	}
}
