package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// While the fabric is away every agent's record fails each second: a
// node with a hundred agents wrote a hundred warnings a second. They
// are said once a pass, then once every failWarnEvery while they keep
// failing, and again once they failed after succeeding.
func TestRecordsThatKeepFailingAreLoggedSeldom(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	st := testStore(t, nc, js)
	var logged strings.Builder
	r := newRecords(st, "n", slog.New(slog.NewTextHandler(&logged, nil)), nil)
	ctx := t.Context()
	var agents []*agent
	for i := range 20 {
		a := &agent{id: fmt.Sprintf("a%d", i), rec: schemas.AgentRecord{ID: fmt.Sprintf("a%d", i), Node: "n", Status: schemas.StatusIdle}}
		if _, err := r.claim(ctx, a); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	b.Shutdown() // the fabric goes away
	warnings := func() int { return strings.Count(logged.String(), "cannot write agents' records") }
	for range 5 {
		for _, a := range agents {
			r.mark(a, false)
		}
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		r.writeAll(short)
		cancel()
	}
	if n := warnings(); n != 1 {
		t.Errorf("five passes of 20 failing records logged %d warnings, want 1:\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), "agents=20") {
		t.Errorf("the warning does not say how many failed:\n%s", logged.String())
	}
}
