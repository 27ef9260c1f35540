package tui

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// nodesTable is the nodes view: each node's labels, its agents against
// its limit, its load as placement counts it, how many of its agents are
// working, its heartbeat's age and what it runs; beneath it, why each
// backend that cannot run agents cannot.
func (m *Model) nodesTable() []string {
	if len(m.nodes) == 0 {
		return []string{styleDim.Render("no nodes: start one with shoal up or shoal node")}
	}
	ns := slices.Clone(m.nodes)
	slices.SortFunc(ns, func(a, b schemas.NodeRecord) int { return strings.Compare(a.Name, b.Name) })
	working := map[string]int{}
	for _, a := range m.agents {
		if a.Status == schemas.StatusWorking {
			working[a.Node]++
		}
	}
	row := func(cols ...string) string {
		return fmt.Sprintf("%-16s %-7s %-5s %-7s %-6s %-24s %s", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6])
	}
	out := []string{styleHeader.Render(clip(row("NODE", "AGENTS", "LOAD", "WORKING", "SEEN", "LABELS", "RUNS"), m.width))}
	for _, n := range ns {
		var runs, problems []string
		for _, b := range n.Backends {
			name := b.Kind
			if b.Agent != "" {
				name += ":" + b.Agent
			}
			if len(b.Models) > 0 {
				name += fmt.Sprintf("(%d models)", len(b.Models))
			}
			if !b.Ready {
				name += "✖"
				why := b.Problem
				if why == "" {
					why = "not ready"
				}
				problems = append(problems, styleError.Render(clip(fmt.Sprintf("    ✖ %s: %s", strings.TrimSuffix(name, "✖"), why), m.width)))
			}
			runs = append(runs, name)
		}
		agents, load := fmt.Sprint(n.Agents), "—"
		if n.MaxAgents > 0 {
			agents += fmt.Sprintf("/%d", n.MaxAgents)
			load = fmt.Sprintf("%d%%", n.Agents*100/n.MaxAgents)
		}
		seen := "—"
		if n.Heartbeat > 0 {
			seen = m.now.Sub(floatTime(n.Heartbeat)).Round(time.Second).String()
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
			labels = append(labels, k+"="+n.Labels[k])
		}
		l := "—"
		if len(labels) > 0 {
			l = strings.Join(labels, ",")
		}
		out = append(out, clip(row(n.Name, agents, load, fmt.Sprint(working[n.Name]), seen, l, strings.Join(runs, " ")), m.width))
		out = append(out, problems...)
		if n.SandboxMode != "" && n.SandboxProblem != "" {
			out = append(out, styleDim.Render(clip("    sandbox: "+n.SandboxProblem, m.width)))
		}
	}
	return out
}
