package bridge_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// The fleet runs under a budget of 1,000 tokens. An agent with no budget
// of its own has a turn running and three held behind it, 800 tokens
// each. The coordinator goes away (a restart, a crash). A shared budget
// is overshot by at most the turns already running when it is reached,
// one per agent, and a held turn is refused when its time comes. The node
// knew its own agent had spent 800, then 1,600 of the fleet's 1,000, yet
// with the budgets unreadable it held each held turn to the fleet's spend
// as last read (0), and every one of them began: 3,200 of 1,000. What the
// node's own turns used since is added at every check.
func TestHeldTurnsPastTheFleetsBudgetWaitWhileTheCoordinatorIsAway(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{atEnd: true, gate: make(chan struct{}), firstOnly: true, interrupt: refuses}
	logs := &lockedBuffer{}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{Fleet: true, Tokens: 1000}); err != nil {
		t.Fatal(err)
	}
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "busy", "disallowed_tools": []string{}}, &rep)
	for range 4 {
		if out, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "busy", "text": "spend 800"}); isErr {
			t.Fatal(out)
		}
	}
	poll.Until(t, 30*time.Second, "the first turn to reach the CLI", func() bool { return be.prompts.Load() == 1 })
	fb.b.Shutdown() // the coordinator goes away
	close(be.gate)
	// The last held turn's time has come once the node has tried to
	// record it (it cannot: the coordinator is away).
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	poll.Until(t, 2*time.Minute, "the node to take up the last held turn", func() bool {
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "cannot record that a held turn begins") && strings.Contains(l, " turn=4 ") {
				return true
			}
		}
		return false
	})
	if n := be.prompts.Load(); n > 2 {
		t.Errorf("under a fleet budget of 1,000 tokens, %d turns of 800 reached the CLI while the coordinator was away (%d tokens): "+
			"held turns began after the node's own agent had taken the fleet past its budget", n, 800*n)
	}
	natstest.Restart(t, fb.b) // so that the node stops cleanly
}
