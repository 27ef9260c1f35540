package bridge_test

import (
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent under a budget of 10,000 tokens gives a child 9,000 while its
// own turn runs: the turn was held to the 10,000 its node read when it
// began, and went on to 10,000, so the family could spend 19,000 of
// 10,000 (and each generation could do it again). A running turn's
// budgets are read again while it spends, every second: it is
// interrupted once past the 1,000 left, well before 10,000 (20 steps of
// 200 ms).
func TestRunningTurnIsHeldToTheBudgetItsGiftsLeave(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 200 * time.Millisecond, gate: make(chan struct{})}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "spender", "budget_tokens": 10000, "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "spender", "text": "spend 30000"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 30*time.Second, "the parent's turn to begin", func() bool {
		rec, err := fb.f.Record(t.Context(), "spender")
		return err == nil && rec.Status == schemas.StatusWorking
	})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "spender"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "heir", "budget_tokens": 9000}); isErr {
		t.Fatalf("the child's open: %s", text)
	}
	close(be.gate) // the parent's turn spends now
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the parent's turn to end", func() bool {
		rec, _ = fb.f.Record(t.Context(), "spender")
		return rec.Status == schemas.StatusIdle && rec.Usage.OutputTokens > 0
	})
	if used := rec.Usage.OutputTokens; used >= 10000 {
		t.Errorf("the parent's turn spent %d tokens after giving 9,000 of its 10,000 away", used)
	}
}
