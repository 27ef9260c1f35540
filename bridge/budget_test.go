package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent raises no budget, its own or another's: an agent under a
// budget of 10,000 tokens opened a child with none and drove it, and the
// child's turns were held to nothing but the fleet's budget; an agent's
// open of an id a person had given a budget beforehand replaced it with
// its own. A child's budget is taken out of its parent's, less than what
// the parent has left, and a budget set on the id beforehand is not
// raised.
func TestDoorTakesAChildsBudgetOutOfItsParents(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	nested := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &nested, false)
	work := t.TempDir()
	putRecord(t, fb, schemas.AgentRecord{ID: "thrifty", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(work),
		Usage: schemas.Usage{InputTokens: 1500, OutputTokens: 500}})
	budget := func(id string) schemas.Budget {
		t.Helper()
		return budgetsOf(t, fb)[id]
	}
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{AgentID: "thrifty", Tokens: 10000}); err != nil {
		t.Fatal(err)
	}
	as := fb.client(map[string]string{schemas.AgentIDHeader: "thrifty"})
	open := func(id string, tokens int) (string, bool) {
		args := map[string]any{"cwd": work, "id": id}
		if tokens > 0 {
			args["budget_tokens"] = tokens
		}
		return call(t, as, "agent_open", args)
	}
	for _, c := range []struct {
		id     string
		tokens int
	}{{"unbudgeted", 0}, {"all-left", 8000}, {"more", 20000}} {
		if text, isErr := open(c.id, c.tokens); !isErr || !strings.Contains(text, "agent thrifty runs under a budget of 10000 tokens and has used 2000 tokens of it: its child's budget is taken out of what is left") {
			t.Errorf("a child %s asking %d tokens: %q, want refused", c.id, c.tokens, text)
		}
	}
	if text, isErr := open("kid", 3000); isErr {
		t.Fatalf("a child within what its parent has left: %s", text)
	}
	if got := budget("kid"); got.Tokens != 3000 {
		t.Errorf("the child's budget: %+v, want 3000 tokens", got)
	}
	if got := budget("thrifty"); got.Tokens != 7000 {
		t.Errorf("the parent's budget after giving 3000: %+v, want 7000 tokens", got)
	}
	// 5,000 are left of its 7,000: the next child gets less than that.
	if text, isErr := open("kid2", 5000); !isErr || !strings.Contains(text, "less than what is left") {
		t.Errorf("a second child asking all that is left: %q", text)
	}
	// A child that does not open gives its budget back: the node has no
	// such backend.
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "failed", "budget_tokens": 1000, "backend": "opencode"}); !isErr {
		t.Errorf("an open the node cannot take: %q", text)
	}
	if got := budget("thrifty"); got.Tokens != 7000 {
		t.Errorf("the parent's budget after a child that did not open: %+v, want 7000 tokens", got)
	}
	// A budget a person set on an id beforehand is not raised by the
	// agent's open; what the child gets is what the parent gives.
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{AgentID: "capped", Tokens: 500}); err != nil {
		t.Fatal(err)
	}
	if text, isErr := open("capped", 2000); isErr {
		t.Fatalf("a child with a budget set beforehand: %s", text)
	}
	if got := budget("capped"); got.Tokens != 500 {
		t.Errorf("the budget a person set beforehand, after the agent's open asking 2000: %+v, want 500", got)
	}
	if got := budget("thrifty"); got.Tokens != 6500 {
		t.Errorf("the parent's budget after giving 500: %+v, want 6500 tokens", got)
	}
	// An id in use takes nothing and changes no budget; a retry of the
	// same open takes nothing again.
	if text, isErr := open("kid", 3000); !isErr || !strings.Contains(text, "in use") {
		t.Errorf("an open of a child in use: %q", text)
	}
	if got, kid := budget("thrifty"), budget("kid"); got.Tokens != 6500 || kid.Tokens != 3000 {
		t.Errorf("after an open of an id in use: the parent's %+v (want 6500), the child's %+v (want 3000)", got, kid)
	}
	same := map[string]any{"cwd": work, "id": "kid4", "budget_tokens": 1000, "request_id": "same-open"}
	for range 2 {
		if text, isErr := call(t, as, "agent_open", same); isErr {
			t.Fatalf("an open and its retry: %s", text)
		}
	}
	if got := budget("thrifty"); got.Tokens != 5500 {
		t.Errorf("the parent's budget after an open and its retry of 1000: %+v, want 5500", got)
	}
	// A closed child reopened is given what its new life may spend, on
	// top of what its lives used.
	if text, isErr := call(t, as, "agent_close", map[string]any{"agent_id": "kid"}); isErr {
		t.Fatalf("closing the child: %s", text)
	}
	if text, isErr := open("kid", 2000); isErr {
		t.Fatalf("reopening the child: %s", text)
	}
	if got, kid := budget("thrifty"), budget("kid"); got.Tokens != 3500 || kid.Tokens != 2000 || kid.GrantedBy != "thrifty" {
		t.Errorf("after reopening the child with 2000: the parent's %+v (want 3500), the child's %+v (want 2000 granted by thrifty)", got, kid)
	}
	// A person's open is not held to any of it.
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "by-person", "budget_tokens": 50000}, &rep)
	if got := budget("by-person"); got.Tokens != 50000 {
		t.Errorf("a person's open's budget: %+v", got)
	}
}

// Two opens of one new child at once (an agent's parallel tool calls):
// both drew on the parent, the one that lost the id gave its draw back
// and, writing back the child's budget as it found it (none), left the
// child that opened running with no budget at all. The second open now
// finds the child's budget changed and takes nothing; every child that
// opens has its budget, and the parent paid once for each.
func TestDoorTakesOneBudgetForTwoOpensOfAChildAtOnce(t *testing.T) {
	t.Parallel()
	fb, work := budgetedParent(t, "twins", schemas.BudgetRequest{Tokens: 100000})
	a := fb.client(map[string]string{schemas.AgentIDHeader: "twins"})
	b := fb.client(map[string]string{schemas.AgentIDHeader: "twins"})
	const kids = 10
	for i := range kids {
		var both sync.WaitGroup
		for _, s := range []*mcp.ClientSession{a, b} {
			both.Go(func() {
				s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_open", Arguments: map[string]any{"cwd": work, "id": fmt.Sprintf("twin%d", i), "budget_tokens": 1000}})
			})
		}
		both.Wait()
	}
	budgets := budgetsOf(t, fb)
	opened := 0
	for i := range kids {
		id := fmt.Sprintf("twin%d", i)
		rec, err := fb.f.Status(t.Context(), id)
		if err != nil {
			continue
		}
		opened++
		if got := budgets[id]; got.Tokens != 1000 || got.GrantedBy != "twins" {
			t.Errorf("child %s (%s) has the budget %+v; want 1000 tokens granted by twins", id, rec.Status, got)
		}
	}
	if opened == 0 {
		t.Fatal("no child opened")
	}
	if got := budgets["twins"]; got.Tokens != 100000-int64(opened)*1000 {
		t.Errorf("the parent's budget after %d children of 1000: %+v, want %d", opened, got, 100000-opened*1000)
	}
}

// A claim its node never took up (the node died during the open) leaves
// the id's record starting; once stale, an open takes the id over. The
// budget draw took such a record for an agent in use and drew nothing,
// so a child opened over it by an agent under a budget ran under none.
// It is drawn as for a dead or closed id.
func TestDoorDrawsAChildsBudgetOverAStaleClaim(t *testing.T) {
	t.Parallel()
	fb, work := budgetedParent(t, "frugal", schemas.BudgetRequest{Tokens: 10000})
	long := float64(time.Now().Add(-schemas.OpenTimeout - 2*time.Minute).Unix())
	putRecord(t, fb, schemas.AgentRecord{ID: "orphan", Status: schemas.StatusStarting, Node: "gone", RequestID: "an-open-long-ago",
		Parent: "frugal", Depth: 1, CWD: work, CreatedAt: long, LastActivity: long})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "frugal"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "orphan"}); !isErr || !strings.Contains(text, "its child's budget is taken out of what is left") {
		t.Errorf("a child over a stale claim asking no budget: %q, want refused", text)
	}
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "orphan", "budget_tokens": 1000}); isErr {
		t.Fatalf("a child over a stale claim: %s", text)
	}
	budgets := budgetsOf(t, fb)
	if got := budgets["orphan"]; got.Tokens != 1000 || got.GrantedBy != "frugal" {
		t.Errorf("the child opened over a stale claim has the budget %+v; want 1000 tokens granted by frugal", got)
	}
	if got := budgets["frugal"]; got.Tokens != 9000 {
		t.Errorf("the parent's budget after giving 1000: %+v, want 9000", got)
	}
}

// An agent under a budget that gives up its agent_open call just after
// the open went to the node: the coordinator's client gave the claim back
// (deleting a fresh id's record) and, finding no record, gave the parent
// its draw back and deleted the child's budget; the node, still opening,
// made the record itself and ran the child under no budget. A child's
// open goes on to its end now, whether or not its caller waits: every
// child that lives has its budget, and the parent paid for each.
func TestDoorKeepsTheDrawOfAnOpenItsCallerGaveUp(t *testing.T) {
	t.Parallel()
	const budget = 1000000
	fb, work := budgetedParent(t, "miser", schemas.BudgetRequest{Tokens: budget})
	const tries = 300
	for i := range tries {
		// Given up a little later each time, across the open's course.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Millisecond+time.Duration(i)*50*time.Microsecond)
		as := fb.client(map[string]string{schemas.AgentIDHeader: "miser"})
		as.CallTool(ctx, &mcp.CallToolParams{Name: "agent_open", Arguments: map[string]any{"cwd": work, "id": fmt.Sprintf("k%d", i), "budget_tokens": 1}})
		cancel()
		as.Close()
	}
	// The opens go on to their ends: every claim is taken up or given back.
	poll.Until(t, time.Minute, "every child's open to end", func() bool {
		for i := range tries {
			if rec, err := fb.f.Record(t.Context(), fmt.Sprintf("k%d", i)); err == nil && rec.Status == schemas.StatusStarting {
				return false
			}
		}
		return true
	})
	budgets := budgetsOf(t, fb)
	live, unbudgeted := 0, []string{}
	for i := range tries {
		id := fmt.Sprintf("k%d", i)
		rec, err := fb.f.Record(t.Context(), id)
		if err != nil || rec.Status == schemas.StatusDead {
			continue
		}
		live++
		if budgets[id].IsZero() {
			unbudgeted = append(unbudgeted, id+" ("+string(rec.Status)+")")
		}
	}
	t.Logf("%d of %d children have a record; the parent paid %d", live, tries, budget-budgets["miser"].Tokens)
	if len(unbudgeted) > 0 {
		t.Errorf("%d children of an agent under a budget have none: %v", len(unbudgeted), unbudgeted)
	}
	if paid := budget - budgets["miser"].Tokens; paid != int64(live) {
		t.Errorf("the parent paid for %d children; %d have a record", paid, live)
	}
}

// A person's budget on an id, set before any agent opened it, bounds
// what an agent's open of it may ask, and is never raised; but the
// child kept all of it for what the parent paid: a parent under 10,000
// tokens and $1 paid 1 token and $0.01 for a child that could spend
// 1,000,000 tokens and any dollars. The child gets the smaller of the
// two in each, and what it gets stays a person's (unmarked), so no
// later open raises it.
func TestDoorGivesNoMoreOfAPersonsBudgetThanTheParentPays(t *testing.T) {
	t.Parallel()
	fb, work := budgetedParent(t, "cheap", schemas.BudgetRequest{Tokens: 10000, USD: 1})
	if err := fb.f.SetBudget(t.Context(), schemas.BudgetRequest{AgentID: "worker", Tokens: 1000000}); err != nil {
		t.Fatal(err)
	}
	as := fb.client(map[string]string{schemas.AgentIDHeader: "cheap"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "worker", "budget_tokens": 1, "budget_usd": 0.01}); isErr {
		t.Fatal(text)
	}
	got := budgetsOf(t, fb)
	if w := got["worker"]; w.Tokens != 1 || w.USD != 0.01 || w.GrantedBy != "" {
		t.Errorf("the child the parent paid 1 token and $0.01 for may spend %+v; want 1 token and $0.01, a person's", w)
	}
	if p := got["cheap"]; p.Tokens != 9999 || p.USD < 0.989 || p.USD > 0.991 {
		t.Errorf("the parent's budget after paying 1 token and $0.01: %+v", p)
	}
	// Closed and opened again, it is given no more: the person's budget
	// (as lowered) is not raised by an agent.
	if text, isErr := call(t, as, "agent_close", map[string]any{"agent_id": "worker"}); isErr {
		t.Fatal(text)
	}
	call(t, as, "agent_open", map[string]any{"cwd": work, "id": "worker", "budget_tokens": 5000, "budget_usd": 0.5})
	if w := budgetsOf(t, fb)["worker"]; w.Tokens > 1 || w.USD > 0.01 {
		t.Errorf("reopened by its parent asking more, the child may spend %+v", w)
	}
}

// budgetedParent is a fabric with node n1 (fake backends) and agent
// parent on it, free to open children, under budget; and the directory
// the parent works in.
func budgetedParent(t *testing.T, parent string, budget schemas.BudgetRequest) (*fabric, string) {
	t.Helper()
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	nested := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &nested, false)
	work := t.TempDir()
	putRecord(t, fb, schemas.AgentRecord{ID: parent, Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(work)})
	budget.AgentID = parent
	if err := fb.f.SetBudget(t.Context(), budget); err != nil {
		t.Fatal(err)
	}
	return fb, work
}

// budgetsOf reads every agent's budget of the fabric, by agent.
func budgetsOf(t *testing.T, fb *fabric) map[string]schemas.Budget {
	t.Helper()
	rep, err := fb.f.Budgets(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]schemas.Budget{}
	for _, l := range rep.Budgets {
		if l.AgentID != "" {
			out[l.AgentID] = l.Budget
		}
	}
	return out
}

// Two opens of one id at once over a stale claim whose budget the parent
// gave it (the claim's client died mid-open): a version of the draw that
// gave that gift back let the losing open take the winner's budget for
// the claim's and delete it, leaving the child that opened under none.
// Every child that lives has its budget, and the family holds no more
// than there was.
func TestDoorTakesOneBudgetForTwoOpensOverAStaleClaim(t *testing.T) {
	t.Parallel()
	fb, work := budgetedParent(t, "frugal", schemas.BudgetRequest{Tokens: 100000})
	_, js := natstest.JetStream(t, fb.b)
	kv, err := js.KeyValue(t.Context(), schemas.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	const ids = 30
	long := float64(time.Now().Add(-schemas.OpenTimeout - 2*time.Minute).Unix())
	gift, _ := json.Marshal(schemas.Budget{Tokens: 1000, GrantedBy: "frugal"})
	for i := range ids {
		id := fmt.Sprintf("o%d", i)
		putRecord(t, fb, schemas.AgentRecord{ID: id, Status: schemas.StatusStarting, Node: "gone", RequestID: "long-ago-" + id,
			Parent: "frugal", Depth: 1, CWD: work, CreatedAt: long, LastActivity: long})
		if _, err := kv.Put(t.Context(), id, gift); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ids {
		id := fmt.Sprintf("o%d", i)
		var both sync.WaitGroup
		for j := range 2 {
			both.Go(func() {
				// The second a little later each time, across the first's course.
				time.Sleep(time.Duration(j*i) * 200 * time.Microsecond)
				fb.f.Open(t.Context(), schemas.OpenRequest{ID: id, CWD: work, Parent: "frugal", Depth: 1, BudgetTokens: 1000, RequestID: fmt.Sprintf("%s-%d", id, j)})
			})
		}
		both.Wait()
	}
	b := budgetsOf(t, fb)
	total := b["frugal"].Tokens
	for i := range ids {
		id := fmt.Sprintf("o%d", i)
		rec, _ := fb.f.Record(t.Context(), id)
		total += b[id].Tokens
		if rec.Status == schemas.StatusIdle && b[id].IsZero() {
			t.Errorf("child %s of frugal (under a budget) lives with no budget (opened by %s)", id, rec.RequestID)
		}
	}
	if total > 100000+ids*1000 {
		t.Errorf("frugal's budget (%d) and its children's: %d, more than the %d there were", b["frugal"].Tokens, total, 100000+ids*1000)
	}
}
