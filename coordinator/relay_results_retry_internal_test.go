package coordinator

import (
	"testing"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// A node publishes in a window and, on a failure, sends everything from
// the failed event on again. When turn 1's result (event 2) was forwarded
// but not stored and turn 2's result (event 5) was forwarded behind it,
// the retry of event 2 was refused for good ("turn 2 has had its result"):
// a number's retry is not refused.
func TestRelayTakesARetryOfAnEarlierResult(t *testing.T) {
	t.Parallel()
	r, err := NewRelay(RelayConfig{Conn: natstest.Connect(t, natstest.Start(t))})
	if err != nil {
		t.Fatal(err)
	}
	s := &sequence{next: 2, stored: 1, ahead: map[uint64]bool{}, flying: map[uint64]int{}, turn: 1}
	r.seqs["a1"] = s
	window := []inflight{
		{agent: "a1", n: 2, turn: 1, result: true}, // turn 1's result: its store fails
		{agent: "a1", n: 3, turn: 2},               // status working
		{agent: "a1", n: 4, turn: 2},               // turn_started
		{agent: "a1", n: 5, turn: 2, result: true}, // turn 2's result
	}
	for i, f := range window {
		if err := r.forwarded(r.token(), "n1", f); err != nil {
			t.Fatalf("window event %d: %v", i, err)
		}
	}
	// Event 2's store failed: the relay's flying count for it drops (acked
	// with an error), and the node sends it again. admit answers forward
	// (n < s.next); forwarded then decides.
	delete(s.flying, 2)
	if err := r.forwarded(r.token(), "n1", inflight{agent: "a1", n: 2, turn: 1, result: true}); err != nil {
		t.Fatalf("the retry of turn 1's result, event 2, was refused for good: %v", err)
	}
}
