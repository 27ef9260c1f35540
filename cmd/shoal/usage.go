package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// usageRow is what the turns of one agent, node or model used.
type usageRow struct {
	Key   string        `json:"key"`
	Turns int           `json:"turns"`
	Usage schemas.Usage `json:"usage"`
}

// usageReport is shoal usage's answer.
type usageReport struct {
	By    string     `json:"by"`
	Since string     `json:"since,omitempty"`
	Rows  []usageRow `json:"rows"`
	Total usageRow   `json:"total"`
}

func usageCommand() *command {
	return verbCommand("usage", "[agent…]", "what the agents' turns used: tokens and cost, per agent, node or model",
		`Sums the usage every ended turn reports (its result event: input, output
and cache tokens, and cost where the CLI gives one) from the stream, so
closed agents, and agents whose records are gone, count, across restarts.
--by agent (the default), node (the node that ran the turn), model (the
agent's model; "unknown" for an agent with no record left) or label (each
key=value label of the node that ran the turn, as it advertises them now
or, for a node gone, as the coordinator last counted it; a turn counts
in each of its node's labels, and "(none)" holds the turns of nodes
without any, so the rows may sum to more than the total). --since keeps
the turns stored from a time (RFC 3339) or an age (2h). A cost no CLI
reported (null in the turn's result: an ACP agent that gave none) is
shown as "-", never as 0; claude and local-model turns carry Kaimon's
cost of 0 and show $0.0000.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var by, since string
			fs.StringVar(&by, "by", "agent", "sum per `key`: agent, node, model or label")
			fs.StringVar(&since, "since", "", "only turns stored from this `time` (RFC 3339) or age (e.g. 2h)")
			return func(ctx context.Context, v *verb, args []string) error {
				if !slices.Contains([]string{"agent", "node", "model", "label"}, by) {
					return usagef("--by %q: agent, node, model or label", by)
				}
				for _, id := range args {
					if err := schemas.ValidID(id); err != nil {
						return usagef("agent %v", err)
					}
				}
				var from client.From
				if since != "" {
					t, err := time.Parse(time.RFC3339, since)
					if err != nil {
						var d time.Duration
						if err := (durationValue{&d}).Set(since); err != nil || d <= 0 {
							return usagef("--since %q is neither a time (RFC 3339) nor an age such as 2h", since)
						}
						t = time.Now().Add(-d)
					}
					from.Time = t
				}
				f, err := v.fabric()
				if err != nil {
					return err
				}
				models := map[string]string{}
				if by == "model" {
					recs, err := f.List(ctx)
					if err != nil {
						return err
					}
					for _, r := range recs {
						models[r.ID] = r.Model
					}
				}
				labels := map[string][]string{}
				if by == "label" {
					if labels, err = nodeLabels(ctx, f); err != nil {
						return err
					}
				}
				rows := map[string]*usageRow{}
				total := usageRow{Key: "total"}
				var results schemas.TurnResults // a turn closed for a lost node counts once
				err = f.Replay(ctx, args, from, false, func(r client.Replayed, _ *client.Gap) error {
					if r.Kind != schemas.KindResult || r.Stray != "" {
						return nil
					}
					ev, err := r.Event()
					if err != nil {
						return nil
					}
					res, ok := ev.Payload.(schemas.Result)
					if !ok {
						return nil
					}
					used, more := results.Take(r.Agent, r.Node, r.Turn, res.Usage)
					if used == nil {
						return nil
					}
					keys := []string{r.Agent}
					switch by {
					case "node":
						keys = []string{r.RanOn}
					case "model":
						keys = []string{models[r.Agent]}
						if keys[0] == "" {
							keys[0] = "unknown"
						}
					case "label":
						keys = labels[r.RanOn]
						if len(keys) == 0 {
							keys = []string{"(none)"}
						}
					}
					for _, key := range keys {
						row := rows[key]
						if row == nil {
							row = &usageRow{Key: key}
							rows[key] = row
						}
						if !more {
							row.Turns++
						}
						row.Usage.Add(*used)
					}
					if !more {
						total.Turns++
					}
					total.Usage.Add(*used)
					return nil
				})
				if gap, ok := errors.AsType[client.Gap](err); ok {
					// What retention dropped is not counted: said.
					fmt.Fprintf(v.env.io.err, "shoal usage: %s (retention dropped them): their turns are not counted\n", gap.Error())
					err = nil
				}
				if err != nil {
					return err
				}
				rep := usageReport{By: by, Rows: []usageRow{}, Total: total}
				if !from.Time.IsZero() {
					rep.Since = from.Time.UTC().Format(time.RFC3339)
				}
				for _, row := range rows {
					rep.Rows = append(rep.Rows, *row)
				}
				slices.SortFunc(rep.Rows, func(a, b usageRow) int {
					if a.Key < b.Key {
						return -1
					}
					if a.Key > b.Key {
						return 1
					}
					return 0
				})
				if v.json {
					return printJSON(v.env, rep)
				}
				tw := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintf(tw, "%s\tTURNS\tIN\tOUT\tCACHE READ\tCACHE WRITE\tCOST\t\n", strings.ToUpper(by))
				for _, row := range append(rep.Rows, rep.Total) {
					u := row.Usage
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t\n", render.Cell(row.Key), row.Turns, u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheCreationTokens, cost(u.CostUSD))
				}
				return tw.Flush()
			}
		})
}

// nodeLabels is each node's labels as budgets name them: as it
// advertises them now, or, for a node gone, as the coordinator's count of
// spend last saw them.
func nodeLabels(ctx context.Context, f client.Client) (map[string][]string, error) {
	out := map[string][]string{}
	if rep, err := f.Budgets(ctx); err == nil {
		for _, r := range rep.Spent.Rows {
			out[r.Node] = r.Labels
		}
	}
	nodes, err := f.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		out[n.Name] = schemas.LabelsOf(n.Labels)
	}
	return out, nil
}

// cost is a cost as a person reads it: "-" where no CLI reported one.
func cost(c *float64) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("$%.4f", *c)
}
