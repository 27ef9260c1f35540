package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/client"
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
--by agent (the default), node (the node that ran the turn) or model (the
agent's model; "unknown" for an agent with no record left). --since keeps
the turns stored from a time (RFC 3339) or an age (2h). A cost no CLI
reported is shown as "-", never as 0: local models report none.`,
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			var by, since string
			fs.StringVar(&by, "by", "agent", "sum per `key`: agent, node or model")
			fs.StringVar(&since, "since", "", "only turns stored from this `time` (RFC 3339) or age (e.g. 2h)")
			return func(ctx context.Context, v *verb, args []string) error {
				if !slices.Contains([]string{"agent", "node", "model"}, by) {
					return usagef("--by %q: agent, node or model", by)
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
				rows := map[string]*usageRow{}
				total := usageRow{Key: "total"}
				err = f.Replay(ctx, args, from, false, func(r client.Replayed, _ *client.Gap) error {
					if r.Kind != schemas.KindResult || r.Stray != "" {
						return nil
					}
					ev, err := r.Event()
					if err != nil {
						return nil
					}
					res, ok := ev.Payload.(schemas.Result)
					if !ok || res.Usage == nil {
						return nil
					}
					key := r.Agent
					switch by {
					case "node":
						key = r.Node
					case "model":
						key = models[r.Agent]
						if key == "" {
							key = "unknown"
						}
					}
					row := rows[key]
					if row == nil {
						row = &usageRow{Key: key}
						rows[key] = row
					}
					row.Turns++
					row.Usage.Add(*res.Usage)
					total.Turns++
					total.Usage.Add(*res.Usage)
					return nil
				})
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
				tw := tabwriter.NewWriter(v.out(), 0, 4, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintf(tw, "%s\tTURNS\tIN\tOUT\tCACHE READ\tCACHE WRITE\tCOST\t\n", map[string]string{"agent": "AGENT", "node": "NODE", "model": "MODEL"}[by])
				for _, row := range append(rep.Rows, rep.Total) {
					u := row.Usage
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t\n", row.Key, row.Turns, u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheCreationTokens, cost(u.CostUSD))
				}
				return tw.Flush()
			}
		})
}

// cost is a cost as a person reads it: "-" where no CLI reported one.
func cost(c *float64) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("$%.4f", *c)
}
