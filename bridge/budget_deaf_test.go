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

// An agent under a budget of 1,000 tokens runs a turn whose CLI reports
// its use as it goes but does not heed an interrupt. The node saw the turn
// cross the budget, sent one interrupt, and never followed it up: the
// turn went on to spend 40,000 tokens. As after its watchdogs' interrupt,
// the node stops a CLI whose turn has not ended InterruptGrace (here 1 s)
// after the budget's.
func TestBudgetStopsATurnWhoseCLIDoesNotHeedTheInterrupt(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 100 * time.Millisecond, interrupt: deaf}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}, InterruptGrace: time.Second})
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "deaf", "budget_tokens": 1000, "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "deaf", "text": "spend 40000"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 60*time.Second, "the turn to end", func() bool {
		rec, err := fb.f.Record(t.Context(), "deaf")
		return err == nil && rec.Status != schemas.StatusWorking && be.spent.Load() > 0
	})
	if spent := be.spent.Load(); spent > 10000 {
		t.Errorf("an agent under a budget of 1,000 tokens spent %d in one turn: its CLI did not heed the budget's interrupt, and nothing followed it up", spent)
	}
}
