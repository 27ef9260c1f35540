package coordinator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// An id opened again whose node is lost before any event of the new life
// is stored: the stream ends with the earlier life's close, and the
// coordinator took that close for the new life's, storing nothing. The
// record said dead; the stream never did, and a reader of the new life's
// turn waited for good. The new life is closed after the earlier one's
// last event (retention, dropping the oldest first, kept that one, so it
// dropped nothing of the new life): no gap, its turn cancelled, dead.
func TestMonitorClosesAReopenedLifeWithNothingStored(t *testing.T) {
	t.Parallel()
	for _, status := range []schemas.AgentStatus{schemas.StatusWorking, schemas.StatusIdle} {
		t.Run(string(status), func(t *testing.T) {
			t.Parallel()
			f := newCloseFabric(t)
			const id = "again"
			// The earlier life: one turn, then closed.
			f.publish(id, 1, schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}, "n1")
			f.publish(id, 2, schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn}}, "n1")
			f.publish(id, 3, schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusClosed}}, "n1")
			// The new life numbered 4 and 5 and turn 2; none of it is stored.
			now := float64(time.Now().Unix())
			putJSON(t, f.agents, id, schemas.AgentRecord{ID: id, Node: "n1", Status: status, Turn: 2, TurnsBefore: 1,
				EventsBefore: 3, LastEvent: 5, EventLog: id + ".jsonl", Model: "sonnet", CWD: "/tmp",
				CreatedAt: now, LastActivity: now, RequestID: "life-2"})

			f.monitor(nil, 100*time.Millisecond)
			poll.Until(t, 30*time.Second, "the new life's stream to end dead", func() bool {
				tail, _, err := client.StreamTail(t.Context(), f.nc, f.stream, id)
				return err == nil && tail.Dead
			})
			var rec schemas.AgentRecord
			poll.Until(t, 10*time.Second, "the record to keep the close no longer", func() bool {
				e, err := f.agents.Get(t.Context(), id)
				rec = schemas.AgentRecord{}
				return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Closing == nil
			})
			got := f.events(id, time.Second)
			if problem := gapless(got, rec.LastEvent); problem != "" {
				t.Fatal(problem)
			}
			var cancelled bool
			for _, s := range got[3:] {
				if r, ok := s.ev.Payload.(schemas.Result); ok && s.ev.Turn == 2 && r.StopReason == schemas.StopCancelled {
					cancelled = true
				}
			}
			if !cancelled {
				t.Errorf("turn 2 has no cancelled result among the close: %+v", got[3:])
			}
		})
	}
}
