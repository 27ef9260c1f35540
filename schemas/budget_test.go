package schemas_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// An allowance holds a turn to the agent's budget, then the fleet's, then
// its node's labels', each against what it covers; a node adds what its
// life ran beyond the count; a budget's key names its scope.
func TestAllowanceHoldsTurnsToEveryBudget(t *testing.T) {
	var spent schemas.Spent
	spent.Seq = 40
	spent.Add("n1", "life2", "sonnet", []string{"team=a"}, schemas.Usage{InputTokens: 600})
	spent.Add("n1", "life1", "sonnet", []string{"team=a"}, schemas.Usage{InputTokens: 100})
	spent.Add("n2", "x", "opus", nil, schemas.Usage{InputTokens: 250})
	spent.Retire("n1", "life2")
	if got := spent.Counted("n1", "life2"); got.InputTokens != 600 {
		t.Fatalf("n1's current life counted %+v, want 600 in", got)
	}
	if got := spent.Counted("n1", "life1"); got.InputTokens != 0 {
		t.Fatalf("n1's earlier life stands apart after Retire: %+v", got)
	}
	if f, l := spent.Fleet(), spent.Label("team=a"); f.InputTokens != 950 || l.InputTokens != 700 {
		t.Fatalf("fleet %+v, team=a %+v", f, l)
	}
	bucket := map[string][]byte{}
	put := func(key string, v any) { bucket[key], _ = json.Marshal(v) }
	put("a1", schemas.Budget{Tokens: 500})
	put(schemas.FleetBudgetKey, schemas.Budget{Tokens: 1200})
	put(schemas.LabelBudgetKey("team=a"), schemas.Budget{Tokens: 800})
	put(schemas.SpentKey, spent)
	get := func(key string) ([]byte, bool, error) { v, ok := bucket[key]; return v, ok, nil }
	a, err := schemas.AllowanceOf("a1", "n1", "life2", []string{"team=a"}, get)
	if err != nil {
		t.Fatal(err)
	}
	if a.Agent.Tokens != 500 || len(a.Shared) != 2 || a.Counted.InputTokens != 600 {
		t.Fatalf("allowance %+v", a)
	}
	for _, c := range []struct {
		own, running, unseen int64
		want                 string // "" allowed, else what the refusal names
	}{
		{0, 0, 0, ""},
		{499, 0, 0, ""},
		{400, 100, 0, "agent a1 has used 500 tokens of its budget of 500: raise it with shoal budget set a1 --tokens N"},
		{0, 99, 0, ""},
		{0, 100, 0, "label team=a has used 800 tokens of its budget of 800: raise it with shoal budget set --label team=a --tokens N"},
		{0, 0, 250, "the fleet has used 1200 tokens of its budget of 1200: raise it with shoal budget set --fleet --tokens N"},
	} {
		al := a.WithUnseen(schemas.Usage{InputTokens: c.unseen})
		err := al.Check("a1", schemas.Usage{InputTokens: c.own}, schemas.Usage{InputTokens: c.running})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: refused: %v", c, err)
		case c.want != "" && (err == nil || err.Error() != c.want || schemas.CodeOf(err) != schemas.CodeUnavailable):
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
	}
	if u := schemas.Unseen(schemas.Usage{InputTokens: 700, CostUSD: schemas.Cost(1)}, a.Counted); u.InputTokens != 100 || u.CostUSD == nil || *u.CostUSD != 1 {
		t.Errorf("unseen %+v", u)
	}
	if u := schemas.Unseen(schemas.Usage{InputTokens: 500}, a.Counted); u.InputTokens != 0 {
		t.Errorf("unseen below the count: %+v", u)
	}
	for _, label := range []string{"team=a", "gpu=yes, please", "k="} {
		if got, ok := schemas.LabelOfBudgetKey(schemas.LabelBudgetKey(label)); !ok || got != label || strings.ContainsAny(schemas.LabelBudgetKey(label)[len("_label."):], ".*> =") {
			t.Errorf("label %q: key %q reads back %q %v", label, schemas.LabelBudgetKey(label), got, ok)
		}
	}
	for _, r := range []schemas.BudgetRequest{{}, {AgentID: "a1", Fleet: true}, {Label: "nolabel"}, {Fleet: true, Tokens: -1}, {AgentID: "Bad Id"}} {
		if _, err := r.Scope(); err == nil || schemas.CodeOf(err) != schemas.CodeInvalid {
			t.Errorf("%+v: %v, want invalid", r, err)
		}
	}
}

// What an agent under a budget may give a child: set, and less than what
// is left, in each of tokens and dollars its budget limits; nothing once
// it has used all of it.
func TestBudgetGrants(t *testing.T) {
	usd := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		have, want schemas.Budget
		used       schemas.Usage
		ok         bool
	}{
		{schemas.Budget{Tokens: 100}, schemas.Budget{Tokens: 50}, schemas.Usage{InputTokens: 40}, true},
		{schemas.Budget{Tokens: 100}, schemas.Budget{Tokens: 60}, schemas.Usage{InputTokens: 40}, false},
		{schemas.Budget{Tokens: 100}, schemas.Budget{}, schemas.Usage{}, false},
		{schemas.Budget{Tokens: 100}, schemas.Budget{Tokens: 1}, schemas.Usage{InputTokens: 100}, false},
		{schemas.Budget{Tokens: 100}, schemas.Budget{Tokens: 1}, schemas.Usage{InputTokens: 150}, false},
		{schemas.Budget{USD: 1}, schemas.Budget{USD: 0.5}, schemas.Usage{CostUSD: usd(0.4)}, true},
		{schemas.Budget{USD: 1}, schemas.Budget{USD: 0.5}, schemas.Usage{CostUSD: usd(0.5)}, false},
		{schemas.Budget{USD: 1}, schemas.Budget{Tokens: 10}, schemas.Usage{}, false},
		{schemas.Budget{Tokens: 100, USD: 1}, schemas.Budget{Tokens: 10, USD: 0.1}, schemas.Usage{}, true},
		{schemas.Budget{Tokens: 100, USD: 1}, schemas.Budget{Tokens: 10}, schemas.Usage{}, false},
		{schemas.Budget{}, schemas.Budget{}, schemas.Usage{InputTokens: 1e9}, true},
	} {
		if got := c.have.Grants(c.want, c.used); got != c.ok {
			t.Errorf("%v with %+v used granting %v: %v, want %v", c.have, c.used, c.want, got, c.ok)
		}
	}
	if got := (schemas.Budget{Tokens: 2000}).Within(schemas.Budget{Tokens: 500}); got.Tokens != 500 {
		t.Errorf("2000 tokens within 500: %v", got)
	}
	if got := (schemas.Budget{}).Within(schemas.Budget{USD: 2}); got.USD != 2 {
		t.Errorf("no budget within $2: %v", got)
	}
}

// A node's turns make a bounded number of rows of the count, whatever
// models and labels it names: past schemas.MaxSpentRowsPerNode they are
// counted in the node's row of model "other" and no labels, still the
// fleet's; another node's rows are its own. A node's labels are few and
// short, and a refusal says which is not.
func TestSpentHoldsANodeToFewRows(t *testing.T) {
	var spent schemas.Spent
	spent.Add("honest", "life", "sonnet", []string{"team=a"}, schemas.Usage{InputTokens: 1})
	for i := range 500 {
		spent.Add("noisy", "life", fmt.Sprintf("model-%d", i), []string{fmt.Sprintf("run=%d", i)}, schemas.Usage{InputTokens: 2})
	}
	spent.Add("honest", "life", "opus", []string{"team=a"}, schemas.Usage{InputTokens: 1})
	rows := map[string]int{}
	for _, r := range spent.Rows {
		rows[r.Node]++
	}
	if rows["noisy"] != schemas.MaxSpentRowsPerNode+1 || rows["honest"] != 2 {
		t.Fatalf("rows by node %v, want %d of noisy's and honest's 2", rows, schemas.MaxSpentRowsPerNode+1)
	}
	if f, l := spent.Fleet(), spent.Label("team=a"); f.InputTokens != 1002 || l.InputTokens != 2 {
		t.Fatalf("fleet %+v, team=a %+v", f, l)
	}
	many := map[string]string{}
	for i := range schemas.MaxNodeLabels + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{many, fmt.Sprintf("a node carries at most %d labels, not %d", schemas.MaxNodeLabels, schemas.MaxNodeLabels+1)},
		{map[string]string{"k": strings.Repeat("v", schemas.MaxLabelBytes)}, fmt.Sprintf("is %d bytes long; a label (key=value) is at most %d", schemas.MaxLabelBytes+2, schemas.MaxLabelBytes)},
	} {
		if err := schemas.ValidNodeLabels(c.labels); err == nil || !strings.Contains(err.Error(), c.want) || schemas.CodeOf(err) != schemas.CodeInvalid {
			t.Errorf("%d labels: %v, want %q", len(c.labels), err, c.want)
		}
	}
	if err := schemas.ValidNodeLabels(map[string]string{"gpu": "a100", "team": "a"}); err != nil {
		t.Errorf("a node's ordinary labels: %v", err)
	}
}
