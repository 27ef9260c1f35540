package client_test

import (
	"testing"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A coordinator of an earlier version refuses a paged list (it checks
// every argument against its schema): the client asks again for the list
// whole, as that coordinator answers it, and lists it in the order the
// agents were made.
func TestListFromACoordinatorOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	asked := earlierVersion(t, srv, schemas.FabricSubject(schemas.VerbList), func(req map[string]any) any {
		if len(req) > 0 {
			return schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid list request: Unknown parameter(s): paged. Valid parameters are: ")}
		}
		return schemas.ListReply{Agents: []schemas.AgentRecord{{ID: "b", CreatedAt: 2}, {ID: "a", CreatedAt: 1}}}
	})
	c, err := client.New(natstest.Connect(t, srv), client.Config{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := c.List(t.Context())
	if a := asked(); err != nil || len(recs) != 2 || recs[0].ID != "a" || len(a) != 2 || a[1] != "{}" {
		t.Errorf("the list from an older coordinator: %+v %v, asked %q", recs, err, a)
	}
}

// The nodes likewise: a coordinator of an earlier version refuses pages,
// and is asked for the nodes whole.
func TestNodesFromACoordinatorOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	asked := earlierVersion(t, srv, schemas.FabricSubject(schemas.VerbNodes), func(req map[string]any) any {
		if len(req) > 0 {
			return schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid nodes request: Unknown parameter(s): paged. Valid parameters are: ")}
		}
		return schemas.NodesReply{Nodes: []schemas.NodeRecord{{Name: "a"}, {Name: "b"}}}
	})
	c, err := client.New(natstest.Connect(t, srv), client.Config{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Nodes(t.Context())
	if a := asked(); err != nil || len(nodes) != 2 || len(a) != 2 || a[1] != "{}" {
		t.Errorf("the nodes from an older coordinator: %+v %v, asked %q", nodes, err, a)
	}
}

// The budgets likewise: a coordinator of an earlier version refuses
// pages, and is asked for them whole.
func TestBudgetsFromACoordinatorOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	asked := earlierVersion(t, srv, schemas.FabricSubject(schemas.VerbBudgets), func(req map[string]any) any {
		if len(req) > 0 {
			return schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid budgets request: Unknown parameter(s): paged. Valid parameters are: ")}
		}
		return schemas.BudgetsReply{Budgets: []schemas.BudgetLine{{Fleet: true, Budget: schemas.Budget{Tokens: 9}}}, Spent: schemas.Spent{Seq: 7}}
	})
	c, err := client.New(natstest.Connect(t, srv), client.Config{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Budgets(t.Context())
	if a := asked(); err != nil || len(rep.Budgets) != 1 || rep.Spent.Seq != 7 || len(a) != 2 || a[1] != "{}" {
		t.Errorf("the budgets from an older coordinator: %+v %v, asked %q", rep, err, a)
	}
}
