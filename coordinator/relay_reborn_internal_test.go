package coordinator

import (
	"testing"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// The relay's watch may pass on a record a node wrote before its agent's
// last events after the relay stored the death among them: the relay took
// that record (not dead) for a new life, forgot the death, and stored the
// node's next event after it (TestMonitorStoresNoCloseANodeForged saw it
// now and then). Only a record numbered from the death on is a new life.
func TestRelayTakesNoRecordOfALifeThatDiedForANewOne(t *testing.T) {
	t.Parallel()
	r, err := NewRelay(RelayConfig{Conn: natstest.Connect(t, natstest.Start(t))})
	if err != nil {
		t.Fatal(err)
	}
	s := &sequence{next: 3, stored: 2, ahead: map[uint64]bool{}, flying: map[uint64]int{}}
	r.seqs["a1"] = s
	s.store(3, true) // the life's dead status, stored
	life := schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, Turn: 1, LastEvent: 2, RequestID: "r1", CreatedAt: 1}
	r.learn("a1", life, 5)
	if !s.dead {
		t.Fatal("a record of the life that died, written before its death, was taken for a new life")
	}
	next := schemas.AgentRecord{ID: "a1", Node: "n2", Status: schemas.StatusStarting, EventsBefore: 3, TurnsBefore: 1, RequestID: "r2", CreatedAt: 2}
	r.learn("a1", next, 9)
	if s.dead {
		t.Fatal("the claim of the id's next life, numbered after the death, was not taken for a new life")
	}
}
