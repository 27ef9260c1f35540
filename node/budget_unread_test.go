package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// While the budgets cannot be read (the relay too busy to answer in
// time, the bucket gone), a send or a run is held to the budgets last
// read and the agent's own use, as a held turn is: it was refused
// outright, and under load a burst of turns to a confined node failed
// on the budget read alone. The turn itself rereads them as it spends.
func TestATurnBeginsWhileItsBudgetsCannotBeRead(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	id := f.open(schemas.OpenRequest{})
	if _, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "While the budgets are read."}); err != nil {
		t.Fatal(err)
	}
	if err := f.js.DeleteKeyValue(f.ctx(10*time.Second), schemas.BudgetsBucket); err != nil {
		t.Fatal(err)
	}
	rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "While the budgets are away."})
	if err != nil || !strings.Contains(rep.Text, "While the budgets are away.") {
		t.Fatalf("a run while the budgets cannot be read: %+v %v", rep, err)
	}
	if turn := f.send(id, "A send too."); turn != 3 {
		t.Errorf("a send while the budgets cannot be read is turn %d, want 3", turn)
	}
}

// An agent whose budgets were never read has none "last read" to be held
// to: while they cannot be read its turn is refused, not begun unbounded
// (a fleet over its budget ran a new agent's turn so; a reader of the
// change above found it).
func TestATurnOfAnAgentWhoseBudgetsWereNeverReadIsRefusedWhileTheyCannotBe(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	a := f.open(schemas.OpenRequest{})
	if rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: a, Text: "spend"}); err != nil {
		t.Fatalf("first run: %+v %v", rep, err)
	}
	if err := f.fabric.SetBudget(f.ctx(10*time.Second), schemas.BudgetRequest{Fleet: true, Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	b := f.open(schemas.OpenRequest{})
	if err := f.js.DeleteKeyValue(f.ctx(10*time.Second), schemas.BudgetsBucket); err != nil {
		t.Fatal(err)
	}
	rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: b, Text: "over the fleet budget"})
	if err == nil || schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Errorf("a run of an agent whose budgets were never read, while they cannot be: %+v %v; want refused, unavailable", rep, err)
	}
}
