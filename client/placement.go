package client

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// place chooses the node for an agent: the one named, or among the nodes
// that can run its model and carry its labels and have room, the least
// loaded (one of them at random when several are). When none fits, the error says why each node was passed over.
func place(nodes []schemas.NodeRecord, req schemas.OpenRequest) (string, error) {
	if req.Node != "" {
		for _, n := range nodes {
			if n.Name == req.Node {
				if why := unfit(n, req); why != "" {
					return "", schemas.Errf(schemas.CodeUnavailable, "node %s cannot take this agent: %s", n.Name, why)
				}
				return n.Name, nil
			}
		}
		return "", schemas.Errf(schemas.CodeNotFound, "no node named %s is running%s", req.Node, nodeList(nodes))
	}
	if len(nodes) == 0 {
		return "", schemas.Errf(schemas.CodeUnavailable, "no node is running: start one with `shoal up` or `shoal node`")
	}
	var fit []schemas.NodeRecord
	var reasons []string
	for _, n := range nodes {
		if why := unfit(n, req); why != "" {
			reasons = append(reasons, n.Name+": "+why)
			continue
		}
		fit = append(fit, n)
	}
	if len(fit) == 0 {
		return "", schemas.Errf(schemas.CodeUnavailable, "no node can take this agent (%s)", strings.Join(reasons, "; "))
	}
	// Among the least loaded, one at random: opens made together see the
	// same loads (a node's record tells of an open only after it), and
	// would all go to the same node if ties went by name.
	least := load(fit[0])
	for _, n := range fit[1:] {
		least = min(least, load(n))
	}
	var tied []string
	for _, n := range fit {
		if load(n) == least {
			tied = append(tied, n.Name)
		}
	}
	return tied[rand.IntN(len(tied))], nil
}

// load is how busy a node is: its share of its limit, or its agent count
// over a large nominal limit when it has none.
func load(n schemas.NodeRecord) float64 {
	if n.MaxAgents > 0 {
		return float64(n.Agents) / float64(n.MaxAgents)
	}
	return float64(n.Agents) / 1000
}

// unfit says why a node cannot take the agent, or "".
func unfit(n schemas.NodeRecord, req schemas.OpenRequest) string {
	if n.Unhealthy != "" {
		return "cannot start agents now: " + n.Unhealthy
	}
	model := req.Model
	if model == "" {
		model = schemas.DefaultModel
	}
	if why := cannotRun(n, model); why != "" {
		return why
	}
	var missing []string
	for k, v := range req.Labels {
		have, ok := n.Labels[k]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("lacks label %s=%s", k, v))
		case have != v:
			missing = append(missing, fmt.Sprintf("has %s=%s, not %s", k, have, v))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return strings.Join(missing, ", ")
	}
	switch {
	case req.SandboxKind == schemas.SandboxNamespaces && n.Sandbox != "" && !schemas.SandboxGives(n.Sandbox, req.SandboxKind):
		return "cannot put agents in namespaces of their own: " + n.SandboxProblem
	case (req.SandboxKind != "" || (req.Sandbox != nil && *req.Sandbox)) && n.Sandbox == "":
		if n.SandboxProblem != "" {
			return "cannot sandbox agents: " + n.SandboxProblem
		}
		return "cannot sandbox agents"
	case req.Sandbox != nil && !*req.Sandbox && n.SandboxMode == schemas.SandboxRequired:
		return "runs every agent sandboxed"
	}
	if n.MaxAgents > 0 && n.Agents >= n.MaxAgents {
		return fmt.Sprintf("is full (%d of %d agents)", n.Agents, n.MaxAgents)
	}
	return ""
}

// cannotRun says why a node cannot run a model, or "".
func cannotRun(n schemas.NodeRecord, model string) string {
	kind, rest := schemas.Route(model)
	agent := ""
	if kind == "acp" {
		agent, _, _ = strings.Cut(rest, ":")
	}
	var found *schemas.BackendInfo
	for i, b := range n.Backends {
		if b.Kind == kind && (kind != "acp" || b.Agent == agent) {
			found = &n.Backends[i]
			break
		}
	}
	what := kind + " agents"
	if agent != "" {
		what = "acp:" + agent + " agents"
	}
	switch {
	case found == nil:
		// The node found none when it last looked (a command not on its
		// PATH, no model server configured).
		return "cannot run " + what + ": it has none"
	case !found.Ready:
		return "cannot run " + what + ": " + found.Problem
	case (kind == "ollama" || kind == "vmlx") && !schemas.ServesModel(found.Models, rest):
		return fmt.Sprintf("does not serve %s model %q", kind, rest)
	}
	return ""
}

func nodeList(nodes []schemas.NodeRecord) string {
	if len(nodes) == 0 {
		return " (no node is running)"
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	return " (nodes: " + strings.Join(names, ", ") + ")"
}
