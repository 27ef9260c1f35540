package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A person sets a budget on an agent that had none while its turn runs
// away: the running turn reports its use every 200 ms, and budgets are
// read again every second while a turn spends (budgetsFresh), so it
// should be interrupted a second or so past the new budget. It never is:
// checkSpend returns before any re-read when the allowance read at the
// turn's start limited nothing, so the turn goes on to its end.
func TestBudgetSetMidTurnOnAnUnlimitedAgentHoldsTheTurn(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 200 * time.Millisecond, gate: make(chan struct{})}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "runaway", "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "runaway", "text": "spend 20000"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 30*time.Second, "the turn to begin", func() bool {
		rec, err := fb.f.Record(t.Context(), "runaway")
		return err == nil && rec.Status == schemas.StatusWorking
	})
	// The person caps it before it spends anything.
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{AgentID: "runaway", Tokens: 2000}); err != nil {
		t.Fatal(err)
	}
	close(be.gate) // 500 tokens each 200 ms: 20,000 takes 8 s
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the turn to end", func() bool {
		rec, _ = fb.f.Record(t.Context(), "runaway")
		return rec.Status == schemas.StatusIdle && rec.Usage.OutputTokens > 0
	})
	if used := rec.Usage.OutputTokens; used >= 6000 {
		t.Errorf("a budget of 2,000 tokens set while the turn ran did not hold it: the turn spent %d tokens", used)
	}
}

// The same with the fleet's budget, the one a person reaches for to stop
// everything: set while a turn of an agent runs under no budget at all,
// it never holds that turn.
func TestFleetBudgetSetMidTurnHoldsTheTurn(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 200 * time.Millisecond, gate: make(chan struct{})}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "runaway", "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "runaway", "text": "spend 20000"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 30*time.Second, "the turn to begin", func() bool {
		rec, err := fb.f.Record(t.Context(), "runaway")
		return err == nil && rec.Status == schemas.StatusWorking
	})
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{Fleet: true, Tokens: 2000}); err != nil {
		t.Fatal(err)
	}
	close(be.gate)
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the turn to end", func() bool {
		rec, _ = fb.f.Record(t.Context(), "runaway")
		return rec.Status == schemas.StatusIdle && rec.Usage.OutputTokens > 0
	})
	if used := rec.Usage.OutputTokens; used >= 6000 {
		t.Errorf("a fleet budget of 2,000 tokens set while the turn ran did not hold it: the turn spent %d tokens", used)
	}
}

// An agent under a budget of 1,000 tokens runs a turn that spends 5,000
// with a second turn held behind it. The coordinator goes away while the
// first runs (a restart, a crash): when the first ends, the node knows
// the agent is past its own budget (its record's use, the budget it read
// at the send), but the held turn begins all the same, reaching the CLI,
// because the budgets could not be read again ("it begins"). The README:
// a held turn is refused when its time comes, and an agent's own budget
// is overshot by at most the part of its running turn before the CLI
// reports the use that crosses it.
func TestHeldTurnPastItsAgentsBudgetBeginsWhileTheCoordinatorIsAway(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{atEnd: true, gate: make(chan struct{}), firstOnly: true, interrupt: refuses}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "capped", "budget_tokens": 1000, "disallowed_tools": []string{}}, &rep)
	for _, text := range []string{"spend 5000", "spend 5000"} {
		if out, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "capped", "text": text}); isErr {
			t.Fatal(out)
		}
	}
	poll.Until(t, 30*time.Second, "the first turn to reach the CLI", func() bool { return be.prompts.Load() == 1 })
	fb.b.Shutdown() // the coordinator goes away
	close(be.gate)  // the first turn ends, 5,000 of 1,000 used
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && be.prompts.Load() < 2 {
		time.Sleep(100 * time.Millisecond)
	}
	if n := be.prompts.Load(); n > 1 {
		t.Errorf("a held turn of an agent 4,000 tokens past its own budget of 1,000 reached its CLI (%d prompts) while the budgets could not be read", n)
	}
	natstest.Restart(t, fb.b) // so that the node stops cleanly
}

// An agent under a budget of 5,000 tokens spends 5,000 in a turn (its CLI
// says so as it goes), then its CLI dies before the turn's result. The
// node closed the turn with a result carrying no usage: the 5,000 were in
// neither the agent's record (its budget's use) nor the coordinator's
// count (the fleet's), nor shoal usage, and the reopened agent spent its
// whole budget again. The cancelled result carries what the CLI said the
// turn used.
func TestSpendOfATurnWhoseCLIDiesIsCounted(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 1000, every: 50 * time.Millisecond, diesFirst: true, interrupt: refuses}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "crashy", "budget_tokens": 5000, "disallowed_tools": []string{}}, &rep)
	if out, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "crashy", "text": "spend 5000"}); isErr {
		t.Fatal(out)
	}
	var rec schemas.AgentRecord
	poll.Until(t, 30*time.Second, "the agent's CLI to die", func() bool {
		rec, _ = fb.f.Record(t.Context(), "crashy")
		return rec.Status == schemas.StatusDead
	})
	if used := schemas.TokensOf(rec.AllLives()); used != 5000 {
		t.Errorf("the CLI reported spending 5,000 tokens in the turn it died in; the agent's record (its budget's use) holds %d", used)
	}
	// The stream's cancelled result says so, for the coordinator's count
	// and shoal usage.
	var counted int64
	if err := fb.f.Replay(t.Context(), []string{"crashy"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		if r.Kind != schemas.KindResult {
			return nil
		}
		ev, err := schemas.Decode(r.Raw)
		if err != nil {
			return err
		}
		if res, ok := ev.Payload.(schemas.Result); ok && res.Usage != nil {
			counted += schemas.TokensOf(*res.Usage)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if counted != 5000 {
		t.Errorf("the stream's results hold %d tokens of the turn the CLI died in, which used 5,000", counted)
	}
	// Its next life, under the same budget, spent: refused.
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "crashy", "disallowed_tools": []string{}}, &rep)
	out, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "crashy", "text": "spend 5000"})
	if !isErr || !strings.Contains(out, "has used 5000 tokens of its budget of 5000") {
		t.Errorf("the second life's send under a spent budget: %v %s; want a refusal naming the budget", isErr, out)
	}
	if spent := be.spent.Load(); spent != 5000 {
		t.Errorf("an agent under a budget of 5,000 tokens spent %d: the turn its CLI died in was not counted", spent)
	}
}
