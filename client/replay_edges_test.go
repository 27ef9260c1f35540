package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Retention has dropped turn 1: a replay from turn 1 says so instead of
// skipping ahead to turn 2, the page API (agent_events, shoal.fabric.events)
// too; a replay from turn 2 works; a replay from the start reports the
// events it can no longer show as a gap before the first one it has.
func TestReplayPastRetentionSaysSo(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
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
	if err := f.Replay(t.Context(), []string{"trimmed"}, client.From{Turn: 1}, false, c.fn); err == nil || err.Error() != want || len(c.evs) != 0 {
		t.Errorf("replay from a dropped turn: %v, after %v", err, c.numbers())
	}
	if _, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "trimmed", FromTurn: 1}); err == nil || err.Error() != want {
		t.Errorf("a page from a dropped turn: %v", err)
	}
	var kept collected
	if err := f.Replay(t.Context(), []string{"trimmed"}, client.From{Turn: 2}, false, kept.fn); err != nil || !equal(kept.numbers(), seq(10, 15)) {
		t.Errorf("replay from a kept turn: %v %v", kept.numbers(), err)
	}
	var all collected
	if err := f.Replay(t.Context(), []string{"trimmed"}, client.From{}, false, all.fn); err != nil || !equal(all.numbers(), seq(10, 15)) {
		t.Fatalf("replay from the start: %v %v", all.numbers(), err)
	}
	if len(all.gaps) != 1 || all.gaps[0] != (client.Gap{Agent: "trimmed", From: 1, To: 9}) {
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
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "resume"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	for trial := range 20 {
		next := a.n + 1
		got := make(chan client.Replayed, 4)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- f.Replay(ctx, []string{"resume"}, client.From{Event: next}, true, func(r client.Replayed, g *client.Gap) error {
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

// A reused id's lives share one turn numbering: its second life goes on
// from its first's last turn. A replay from a turn of the second life
// finds it past the first life's death, agent_output reads it, and a turn
// of the first life that retention dropped is an error, not a skip; a
// following replay from a turn no life still has says so once it has
// caught up.
func TestReplayFromATurnOfAReusedID(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "reused"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	a.turn(1, "first")  // events 2-8
	a.turn(2, "second") // events 9-15
	a.emit(2, schemas.Status{Status: schemas.StatusDead})
	a.emit(2, schemas.Status{Status: schemas.StatusIdle}) // 17: the second life
	a.turn(3, "again")                                    // 18-24
	s, _ := js.Stream(t.Context(), schemas.StreamName)
	if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(10)); err != nil { // events 1-9 are gone
		t.Fatal(err)
	}
	var c collected
	if err := f.Replay(t.Context(), []string{"reused"}, client.From{Turn: 3}, false, c.fn); err != nil || !equal(c.numbers(), seq(18, 24)) {
		t.Errorf("replay from turn 3: %v %v, want the second life's turn, events 18-24", c.numbers(), err)
	}
	kv, _ := js.KeyValue(t.Context(), schemas.AgentsBucket)
	kv.Put(t.Context(), "reused", []byte(`{"id":"reused","status":"idle","turn":3,"node":"n1"}`))
	turn := 3
	out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "reused", Turn: &turn})
	if err != nil || out.Text != "again" || out.Turn != 3 {
		t.Errorf("agent_output of the second life's turn 3: %+v %v", out, err)
	}
	turn = 1
	if out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "reused", Turn: &turn}); schemas.CodeOf(err) != schemas.CodeNotFound ||
		!strings.Contains(err.Error(), "turn 1 of agent reused is past the stream's retention") {
		t.Errorf("agent_output of a dropped turn: %+v %v", out, err)
	}
	var dropped collected
	if err := f.Replay(t.Context(), []string{"reused"}, client.From{Turn: 1}, false, dropped.fn); schemas.CodeOf(err) != schemas.CodeNotFound || len(dropped.evs) != 0 {
		t.Errorf("replay from a dropped turn: %v %v", dropped.numbers(), err)
	}

	// Another agent loses its turn 1 (and nothing else has one).
	l := &agentStream{t: t, js: js, id: "lost"}
	l.emit(0, schemas.Status{Status: schemas.StatusIdle})
	l.turn(1, "first")
	l.turn(2, "second")
	info, _ := s.Info(t.Context())
	if err := s.Purge(t.Context(), jetstream.WithPurgeSubject("agent.lost"), jetstream.WithPurgeSequence(info.State.LastSeq-6)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var followed collected
	err = f.Replay(ctx, []string{"lost"}, client.From{Turn: 1}, true, followed.fn)
	if ctx.Err() != nil || err == nil || !strings.Contains(err.Error(), "turn 1 of agent lost is past the stream's retention") || len(followed.evs) != 0 {
		t.Errorf("a following replay from a dropped turn: %v (%v), after %v", err, ctx.Err(), followed.numbers())
	}
	c.check(t)
}

// Turns sent while another runs: their echoes come before the running
// turn ends. A replay (and a page) from turn 2 starts with turn 2's own
// prompt and shows turn 3's, which came before turn 2 began; an earlier
// version kept only the last echo it had passed and lost turn 2's.
func TestReplayFromAHeldTurnHasItsPrompt(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "queued"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})       // 1
	a.emit(0, schemas.UserText{Content: schemas.Text("first")}) // 2
	a.emit(1, schemas.Status{Status: schemas.StatusWorking})    // 3
	a.emit(1, schemas.TurnStarted{})                            // 4
	second := a.emit(1, schemas.UserText{Content: schemas.Text("second")})
	third := a.emit(2, schemas.UserText{Content: schemas.Text("third")})
	a.emit(1, schemas.AssistantText{Content: schemas.Text("one")}) // 7
	a.emit(1, schemas.Status{Status: schemas.StatusIdle})          // 8
	a.emit(1, schemas.Result{StopReason: schemas.StopEndTurn})     // 9
	start := a.emit(2, schemas.Status{Status: schemas.StatusWorking})
	a.emit(2, schemas.TurnStarted{}) // 11
	var c collected
	if err := f.Replay(t.Context(), []string{"queued"}, client.From{Turn: 2}, false, c.fn); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{second, third, start, start + 1}; !equal(c.numbers(), want) {
		t.Errorf("replay from turn 2 delivered %v, want %v", c.numbers(), want)
	}
	page, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "queued", FromTurn: 2})
	if err != nil || len(page.Events) == 0 || page.Events[0].N != second {
		t.Errorf("a page from turn 2: %+v %v", page.Events, err)
	}
}
