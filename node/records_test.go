package node

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A reopened id belongs to its new life: the death of the previous life,
// still waiting to be written when the id is claimed again, never lands
// on the new record, and forgetting the old life leaves the new one.
func TestRecordOfAReopenedAgent(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	st := testStore(t, nc, js)
	r := newRecords(st, "n", slog.New(slog.DiscardHandler), nil)
	ctx := t.Context()
	life := func(status schemas.AgentStatus) *agent {
		return &agent{id: "pal", rec: schemas.AgentRecord{ID: "pal", Node: "n", Status: status}}
	}
	first := life(schemas.StatusIdle)
	if _, err := r.claim(ctx, first); err != nil {
		t.Fatal(err)
	}
	first.rec.Status = schemas.StatusDead
	r.mark(first, true) // the first life's death, not yet written

	second := life(schemas.StatusStarting)
	if _, err := r.claim(ctx, second); err != nil {
		t.Fatal(err)
	}
	r.mark(first, true) // and once more, after the claim
	r.flush(ctx)
	r.forget(ctx, first, false)

	e, err := st.get(ctx, "pal")
	if err != nil {
		t.Fatal(err)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal(e.value, &rec); err != nil || rec.Status != schemas.StatusStarting {
		t.Fatalf("the record after reopening is %+v (%v), want the second life's", rec, err)
	}
}
