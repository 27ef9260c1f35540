package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/shoalfabric/shoal/schemas"
)

func budgetCommand() *command {
	return verbCommand("budget", "[set] [<agent> | --fleet | --label key=value]", "show or set what agents, the fleet or a label's nodes may spend",
		`shoal budget lists every budget with what was used against it, and what
the fleet's turns used in all; shoal budget <agent>, --fleet or --label
key=value shows one. shoal budget set <agent> | --fleet | --label
key=value [--tokens N] [--usd X] sets it (raises or lowers it; 0 lifts
that limit, and a limit not given stays as it is), and the next turn is
held to it.

An agent's budget holds its own turns; the fleet's, every agent's turns
together; a label's, the turns of the agents on the nodes that carry it
(shoal node --labels). A turn that would start past a budget is refused
before it reaches the agent's CLI (exit 4), naming the budget, what was
used and how to raise it; a running turn that crosses one is interrupted,
with an error event saying which. What the fleet and the labels used is
the coordinator's count of the turns' result events, which survives
restarts of nodes and of the coordinator (shoal usage reads the same
events). Turns already running when a shared budget is reached go on, so
the fleet overshoots by at most those. Tokens are input, output and cache
tokens; a cost counts only where the agent's CLI reports one.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var req schemas.BudgetRequest
			fs.BoolVar(&req.Fleet, "fleet", false, "the budget of every agent together")
			fs.StringVar(&req.Label, "label", "", "the budget of the agents on the nodes carrying `key=value`")
			fs.Int64Var(&req.Tokens, "tokens", 0, "with set: the most `tokens` the turns may use in all (0: no limit)")
			fs.Float64Var(&req.USD, "usd", 0, "with set: the most `dollars` the turns may cost in all (0: no limit)")
			return func(ctx context.Context, v *verb, args []string) error {
				set := len(args) > 0 && args[0] == "set"
				if set {
					args = args[1:]
				}
				switch {
				case len(args) > 1:
					return usagef("unexpected argument %q", args[1])
				case len(args) == 1:
					if err := schemas.ValidID(args[0]); err != nil {
						return usagef("agent %v", err)
					}
					req.AgentID = args[0]
				}
				all := req.AgentID == "" && !req.Fleet && req.Label == ""
				if set && all {
					return usagef("shoal budget set names what it sets: an agent, --fleet or --label key=value")
				}
				if _, err := req.Scope(); !all && err != nil {
					return usagef("%v", err)
				}
				if !set && (req.Tokens != 0 || req.USD != 0) {
					return usagef("--tokens and --usd go with shoal budget set")
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				if set {
					given := map[string]bool{}
					fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
					if !given["tokens"] && !given["usd"] {
						return usagef("shoal budget set needs --tokens N, --usd X or both (0 lifts that limit)")
					}
					// The limit not given stays as it is.
					req.KeepTokens, req.KeepUSD = !given["tokens"], !given["usd"]
					if err := f.SetBudget(ctx, req); err != nil {
						return err
					}
					// A budget may wait for its agent (an open sets its
					// own this way); a mistyped id should not pass unsaid.
					if req.AgentID != "" {
						if _, err := f.Status(ctx, req.AgentID); schemas.CodeOf(err) == schemas.CodeNotFound {
							if lifts := (!given["tokens"] || req.Tokens == 0) && (!given["usd"] || req.USD == 0); lifts {
								fmt.Fprintf(v.env.io.err, "shoal budget: no agent has the id %s yet (is it mistyped?)\n", req.AgentID)
							} else {
								fmt.Fprintf(v.env.io.err, "shoal budget: no agent has the id %s yet; the budget holds it once one is opened under it\n", req.AgentID)
							}
						}
					}
				}
				rep, err := f.Budgets(ctx)
				if err != nil {
					return err
				}
				if all {
					return printBudgets(v, rep)
				}
				want, _ := req.Scope()
				line := schemas.BudgetLine{AgentID: want.Agent, Fleet: want.Fleet, Label: want.Label}
				found := false
				for _, l := range rep.Budgets {
					if l.Scope() == want {
						line, found = l, true
					}
				}
				if !found {
					// No budget: what was used all the same.
					switch {
					case want.Fleet:
						line.Used = rep.Spent.Fleet()
					case want.Label != "":
						line.Used = rep.Spent.Label(want.Label)
					default:
						// An agent not opened yet has used nothing.
						rec, err := f.Status(ctx, want.Agent)
						if err != nil && schemas.CodeOf(err) != schemas.CodeNotFound {
							return err
						}
						line.Used = rec.AllLives()
					}
				}
				return v.reply(line, budgetLine(line))
			}
		})
}

// budgetLine says one budget and what was used against it.
func budgetLine(l schemas.BudgetLine) string {
	return fmt.Sprintf("%s: budget %s; used %d tokens, cost %s", l.Scope(), l.Budget, schemas.TokensOf(l.Used), cost(l.Used.CostUSD))
}

// printBudgets prints every budget, then what the fleet used.
func printBudgets(v *verb, rep schemas.BudgetsReply) error {
	if v.json {
		return printJSON(v.env, rep)
	}
	tw := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUDGET OF\tTOKENS\tUSD\tUSED TOKENS\tCOST")
	for _, l := range rep.Budgets {
		limit := func(set bool, s string) string {
			if !set {
				return "-"
			}
			return s
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", l.Scope(), limit(l.Budget.Tokens > 0, fmt.Sprint(l.Budget.Tokens)),
			limit(l.Budget.USD > 0, fmt.Sprintf("$%.4f", l.Budget.USD)), schemas.TokensOf(l.Used), cost(l.Used.CostUSD))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var turns int64
	for _, r := range rep.Spent.Rows {
		turns += r.Turns
	}
	fleet := rep.Spent.Fleet()
	var labels []string
	for _, l := range rep.Budgets {
		if l.Label != "" {
			labels = append(labels, l.Label)
		}
	}
	_, err := fmt.Fprintf(v.text(), "the fleet's turns used %d tokens, cost %s, in %d turns%s\n", schemas.TokensOf(fleet), cost(fleet.CostUSD), turns,
		map[bool]string{true: " (labels with budgets: " + strings.Join(labels, ", ") + ")"}[len(labels) > 0])
	return err
}
