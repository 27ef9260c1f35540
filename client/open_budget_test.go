package client_test

import (
	"testing"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An open with a budget sets the budget before its node hears of the
// agent; an open that failed left it there (no such node, a directory
// missing), and a later open of the id, asking for no budget, was held to
// it without a word (outside review). A failed open puts back what the
// id's budget was: none, or the one it had.
func TestAFailedOpenLeavesNoBudget(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	budgetOf := func(id string) *schemas.Budget {
		t.Helper()
		rep, err := f.Budgets(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range rep.Budgets {
			if b.AgentID == id {
				return &b.Budget
			}
		}
		return nil
	}
	for _, req := range []schemas.OpenRequest{
		{ID: "ghost", Node: "nosuchnode", CWD: t.TempDir(), BudgetTokens: 777},
		{ID: "ghost", Node: "a", CWD: "/no/such/dir", BudgetTokens: 777},
	} {
		if _, err := f.Open(t.Context(), req); err == nil {
			t.Fatalf("the open %+v succeeded", req)
		}
		if b := budgetOf("ghost"); b != nil {
			t.Errorf("the failed open on node %s left the budget %+v", req.Node, *b)
		}
	}
	// One that had a budget keeps it.
	if err := f.SetBudget(t.Context(), schemas.BudgetRequest{AgentID: "kept", Tokens: 500}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Open(t.Context(), schemas.OpenRequest{ID: "kept", Node: "nosuchnode", CWD: t.TempDir(), BudgetTokens: 777}); err == nil {
		t.Fatal("the open on no node succeeded")
	}
	if b := budgetOf("kept"); b == nil || b.Tokens != 500 {
		t.Errorf("the budget of an id after a failed open asking for another: %+v, want the 500 it had", b)
	}
	// One that opens keeps the budget it asked for.
	if _, err := f.Open(t.Context(), schemas.OpenRequest{ID: "real", Node: "a", CWD: t.TempDir(), BudgetTokens: 777}); err != nil {
		t.Fatal(err)
	}
	if b := budgetOf("real"); b == nil || b.Tokens != 777 {
		t.Errorf("the budget of an agent opened with one: %+v", b)
	}
}
