package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/shoalfabric/shoal/schemas"
)

func budgetCommand() *command {
	return verbCommand("budget", "[set] <agent>", "show or set what an agent's turns may use",
		`shoal budget <agent> shows the agent's budget and what its turns have
used; shoal budget set <agent> --tokens N [--usd X] sets it (raises or
lowers it: 0 lifts that limit), and the agent's next turn is held to it.
A turn that would start past a budget is refused before it reaches the
agent's CLI (exit 4), naming the budget and what was used; the turns
already sent go on, so an agent overshoots by at most those.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var b schemas.Budget
			fs.Int64Var(&b.Tokens, "tokens", 0, "with set: the most `tokens` its turns may use in all (0: no limit)")
			fs.Float64Var(&b.USD, "usd", 0, "with set: the most `dollars` its turns may cost in all (0: no limit)")
			return func(ctx context.Context, v *verb, args []string) error {
				set := len(args) > 0 && args[0] == "set"
				if set {
					args = args[1:]
				}
				id, err := oneAgent(args)
				if err != nil {
					return err
				}
				if !set && (b.Tokens != 0 || b.USD != 0) {
					return usagef("--tokens and --usd go with shoal budget set %s", id)
				}
				d, err := v.direct("shoal budget")
				if err != nil {
					return err
				}
				if set {
					if err := d.SetBudget(ctx, id, b); err != nil {
						return err
					}
				}
				cur, err := d.Budget(ctx, id)
				if err != nil {
					return err
				}
				rec, err := d.Status(ctx, id)
				if err != nil {
					return err
				}
				used := schemas.TokensOf(rec.Usage)
				limit := "no limit"
				if cur.Tokens > 0 {
					limit = fmt.Sprintf("%d tokens", cur.Tokens)
				}
				if cur.USD > 0 {
					limit += fmt.Sprintf(", $%.4f", cur.USD)
				}
				return v.reply(map[string]any{"agent_id": id, "budget": cur, "used_tokens": used, "usage": rec.Usage},
					fmt.Sprintf("agent %s: budget %s; used %d tokens, cost %s", id, limit, used, cost(rec.Usage.CostUSD)))
			}
		})
}
