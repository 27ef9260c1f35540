package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
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

// awayStore is a store whose writes fail while away is set, as while the
// coordinator's relay is down.
type awayStore struct {
	store
	away atomic.Bool
}

func (s *awayStore) update(ctx context.Context, id string, val []byte, rev uint64) (uint64, error) {
	if s.away.Load() {
		return 0, errors.New("the coordinator's relay is not reachable")
	}
	return s.store.update(ctx, id, val, rev)
}

func (s *awayStore) remove(ctx context.Context, id string, rev uint64) error {
	if s.away.Load() {
		return errors.New("the coordinator's relay is not reachable")
	}
	return s.store.remove(ctx, id, rev)
}

// An open that fails after its node took up the claim gives the claim
// back; when the fabric did not take that (a coordinator away as the open
// failed), the record said starting for good, naming a node that runs no
// such agent: no send, close or reopen could end it. The node writes it
// dead once the fabric is back, as it writes any record of its agents.
func TestAClaimGivenBackWhileTheFabricIsAwayEndsDead(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	st := &awayStore{store: testStore(t, nc, js)}
	r := newRecords(st, "n", slog.New(slog.DiscardHandler), nil)
	ctx := t.Context()
	a := &agent{id: "gone", rec: schemas.AgentRecord{ID: "gone", Node: "n", Status: schemas.StatusStarting, EventLog: "/x/gone.jsonl"}}
	release, err := r.claim(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	st.away.Store(true)
	release(ctx)
	st.away.Store(false)
	r.flush(ctx)
	e, err := st.get(ctx, "gone")
	if err != nil {
		t.Fatalf("the record after the claim was given back while the fabric was away: %v", err)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal(e.value, &rec); err != nil || rec.Status != schemas.StatusDead {
		t.Fatalf("the record after the claim was given back while the fabric was away, and the fabric came back: %+v (%v), want dead", rec, err)
	}
	// Written dead, the life is the node's no more: nothing writes it again.
	r.mu.Lock()
	kept := r.life["gone"] != nil
	r.mu.Unlock()
	if kept {
		t.Error("the node still keeps the life of the failed open once its record is written dead")
	}
}
