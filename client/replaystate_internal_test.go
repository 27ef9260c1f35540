package client

import (
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// An error between turns, stamped with a turn not begun yet, is no sign
// that retention dropped that turn's start: a replay from it reads on. (A
// node restarted with a permission request open and a turn held stamped
// its denial with the held turn; it now stamps the running one.) Found by
// a read of the change that made a turn's later events, seen before its
// start, mean its start was dropped.
func TestAnErrorBetweenTurnsIsNoTurnPassedOver(t *testing.T) {
	var got []Replayed
	rs := &replayState{turn: 5, fn: func(r Replayed, _ *Gap) error { got = append(got, r); return nil }}
	ev := func(n uint64, turn int, p schemas.Payload) *Replayed {
		raw, err := schemas.Encode(schemas.Event{Turn: turn, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		e, _ := schemas.Decode(raw)
		return &Replayed{Agent: "a", N: n, Turn: turn, Kind: e.Kind(), Raw: raw}
	}
	// History starts mid-life (event 1 aged out): turn 4 running.
	rs.add(ev(40, 4, schemas.Status{Status: schemas.StatusWorking}), nil)
	rs.add(ev(41, 4, schemas.TurnStarted{}), nil)
	rs.add(ev(42, 5, schemas.Errorf("permission request r1 (Bash) was denied: node n1 restarted")), nil)
	if rs.passedOver() {
		t.Errorf("after the restart's denial (stamped with held turn 5), before turn 5's start: passedOver true; a follow caught up here fails with: %v", rs.missed())
	}
}
