package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

func nodesCommand() *command {
	return verbCommand("nodes", "", "list the nodes of the fabric and what they run",
		"Lists every node whose heartbeat is current: what it can run, its labels,\nits agents, and how long ago it last checked in. A backend in brackets is\none the node has but cannot run now (a CLI missing or logged out, a model\nserver not answering): a line under the table says why.",
		func(fs *flag.FlagSet) func(context.Context, *verb, []string) error {
			return func(ctx context.Context, v *verb, args []string) error {
				f, err := v.fabric()
				if err != nil {
					return err
				}
				nodes, err := f.Nodes(ctx)
				if err != nil {
					return err
				}
				if v.json {
					return printJSON(v.env, map[string]any{"nodes": nodes})
				}
				if len(nodes) == 0 {
					fmt.Fprintln(v.out(), "No nodes. Start one with `shoal up` or `shoal node`.")
					return nil
				}
				tw := tabwriter.NewWriter(v.text(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NODE\tRUNS\tLABELS\tAGENTS\tHOST\tSEEN")
				for _, n := range nodes {
					agents := fmt.Sprint(n.Agents)
					if n.MaxAgents > 0 {
						agents += fmt.Sprintf("/%d", n.MaxAgents)
					}
					seen := time.Since(time.Unix(0, int64(n.Heartbeat*1e9))).Round(time.Second)
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%s %d cpu\t%s ago\n", render.Cell(n.Name), render.Cell(runs(n.Backends)), render.Cell(labels(n.Labels)), agents, render.Cell(n.Host.OS), render.Cell(n.Host.Arch), n.Host.CPUs, seen)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, n := range nodes {
					for _, b := range n.Backends {
						if !b.Ready && b.Problem != "" {
							fmt.Fprintf(v.text(), "%s cannot run %s now: %s\n", render.Cell(n.Name), render.Cell(backendName(b)), render.Cell(b.Problem))
						}
					}
				}
				return nil
			}
		})
}

// backendName is a backend's kind, and its agent for an ACP one.
func backendName(b schemas.BackendInfo) string {
	if b.Agent != "" {
		return b.Kind + ":" + b.Agent
	}
	return b.Kind
}

// runs summarises what a node can run: ready backends plainly, detected
// ones it cannot run in brackets.
func runs(bs []schemas.BackendInfo) string {
	var out []string
	for _, b := range bs {
		name := backendName(b)
		switch n := len(b.Models); {
		case n == 1:
			name += "(1 model)"
		case n > 1:
			name += fmt.Sprintf("(%d models)", n)
		}
		if !b.Ready {
			name = "[" + name + "]"
		}
		out = append(out, name)
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

func labels(l map[string]string) string {
	var out []string
	for k, v := range l {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}
