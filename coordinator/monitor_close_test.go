package coordinator_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator closing a lost node's agent writes the record dead and
// then stores the closing events; one that stopped between the two (or
// between two of the events) left a record that said dead over a stream
// that never did, and nothing finished it: a reader waited on a turn
// that would never end. The record keeps the close until its events are
// stored, and the next sweep stores those missing, numbered on.
func TestMonitorFinishesACloseItsCoordinatorStoppedIn(t *testing.T) {
	t.Parallel()
	for _, stored := range []int{0, 1} {
		t.Run(fmt.Sprintf("%d closing events stored", stored), func(t *testing.T) {
			t.Parallel()
			f := newCloseFabric(t)
			const id = "a1"
			live := f.lostMidTurn(id)
			live.Running = &schemas.Usage{OutputTokens: 7}
			// The close, as far as the coordinator got: the record, and
			// stored of the events.
			dead := f.cutOffClose(live)
			from, events, err := dead.ClosingEvents()
			if err != nil {
				t.Fatal(err)
			}
			if len(events) < 3 {
				t.Fatalf("the close of a running turn is %d events: %+v", len(events), events)
			}
			for i := range stored {
				f.publish(id, from+1+uint64(i), events[i], schemas.CloserName)
			}

			f.monitor(nil, 100*time.Millisecond)
			poll.Until(t, 30*time.Second, "the agent's stream to end dead", func() bool {
				tail, _, err := client.StreamTail(t.Context(), f.nc, f.stream, id)
				return err == nil && tail.Dead
			})
			poll.Until(t, 10*time.Second, "the record to keep the close no longer", func() bool {
				e, err := f.agents.Get(t.Context(), id)
				var rec schemas.AgentRecord
				return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Closing == nil
			})
			// Every number once, in order, to the record's last; the
			// stream ends dead, the turn's result cancelled with what it
			// used.
			got := f.events(id, time.Second)
			if problem := gapless(got, dead.LastEvent); problem != "" {
				t.Fatal(problem)
			}
			var result *schemas.Result
			for _, s := range got {
				if r, ok := s.ev.Payload.(schemas.Result); ok {
					result = &r
				}
			}
			if result == nil || result.StopReason != schemas.StopCancelled || result.Usage == nil || result.Usage.OutputTokens != 7 {
				t.Errorf("turn 1's result: %+v", result)
			}
		})
	}
}

// A close cut off so long ago that the agent's events aged out of the
// stream (its end with them, perhaps) is not stored again over nothing:
// the record drops it.
func TestMonitorStoresNoCloseOfEventsAgedOut(t *testing.T) {
	t.Parallel()
	f := newCloseFabric(t)
	now := float64(time.Now().Unix())
	live := schemas.AgentRecord{ID: "aged", Node: "n1", Status: schemas.StatusWorking, Turn: 1, LastEvent: 2, EventLog: "aged.jsonl",
		Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now}
	putJSON(t, f.agents, "aged", schemas.CloseLost(live, schemas.Tail{Last: 2, Turn: 1, Open: true}, "node n1 was lost", schemas.CloserName))
	f.monitor(nil, 100*time.Millisecond)
	poll.Until(t, 30*time.Second, "the record to keep the close no longer", func() bool {
		e, err := f.agents.Get(t.Context(), "aged")
		var rec schemas.AgentRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Closing == nil
	})
	if info, err := f.stream.Info(t.Context(), jetstream.WithSubjectFilter(schemas.EventSubject("aged"))); err != nil || len(info.State.Subjects) != 0 {
		t.Errorf("the close of events aged out was stored over nothing: %v %v", info.State.Subjects, err)
	}
}

// Two coordinators' monitors, started together, both find twenty cut-off
// closes at their grace sweep and finish them at once: each stream is
// numbered 1..last_event once each and ends dead.
func TestTwoMonitorsFinishingTheSameClosesStoreEachEventOnce(t *testing.T) {
	t.Parallel()
	f := newCloseFabric(t)
	var deads []schemas.AgentRecord
	for i := range 20 {
		live := f.lostMidTurn(fmt.Sprintf("a%d", i))
		live.Turn, live.Held = 3, 2 // and two turns held behind it
		deads = append(deads, f.cutOffClose(live))
	}
	for range 2 {
		f.monitor(f.conn(), 300*time.Millisecond)
	}
	for _, dead := range deads {
		poll.Until(t, 30*time.Second, "the close of "+dead.ID+" to be stored", func() bool {
			tail, _, err := client.StreamTail(t.Context(), f.nc, f.stream, dead.ID)
			return err == nil && tail.Dead
		})
		if problem := gapless(f.events(dead.ID, 500*time.Millisecond), dead.LastEvent); problem != "" {
			t.Errorf("%s: %s", dead.ID, problem)
		}
	}
}
