package schemas

import "fmt"

// BudgetsBucket is the KV bucket of budgets: an agent's id to the Budget
// its turns may use (set at its open, raised with shoal budget set),
// written by the coordinator's side and read by the node that starts the
// agent's turns.
const BudgetsBucket = "shoal_budgets"

// Budget is what an agent's turns may use, in all: tokens (input, output
// and cache, as its turns report them) and cost in dollars (where its CLI
// reports one). Zero is no limit.
type Budget struct {
	Tokens int64   `json:"tokens,omitempty"`
	USD    float64 `json:"usd,omitempty"`
}

// TokensOf are the tokens a usage counts against a budget.
func TokensOf(u Usage) int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheCreationTokens
}

// Spent says why a turn may not start for agent id with usage u under
// budget b, or nil when it may.
func (b Budget) Spent(id string, u Usage) error {
	if used := TokensOf(u); b.Tokens > 0 && used >= b.Tokens {
		return Errf(CodeUnavailable, "agent %s has used %d tokens of its budget of %d: raise it with shoal budget set %s --tokens N", id, used, b.Tokens, id)
	}
	if b.USD > 0 && u.CostUSD != nil && *u.CostUSD >= b.USD {
		return Errf(CodeUnavailable, "agent %s has spent %s of its budget of $%.4f: raise it with shoal budget set %s --usd X", id, fmt.Sprintf("$%.4f", *u.CostUSD), b.USD, id)
	}
	return nil
}
