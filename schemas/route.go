package schemas

import (
	"slices"
	"strings"
)

// Backend kinds, as Route returns them.
const (
	BackendClaude = "claude"
	BackendACP    = "acp"
	BackendOllama = "ollama"
	BackendVMLX   = "vmlx"
)

// Route picks the backend for a model string, Kaimon's way (first match
// wins): acp:<agent>[:<model>], vmlx:<tag>, ollama:<tag>, anything else
// is the claude CLI. It returns the kind and the model with its prefix
// removed. Placement and the nodes route by it alike.
func Route(model string) (kind, rest string) {
	for _, k := range []string{BackendACP, BackendVMLX, BackendOllama} {
		if r, ok := strings.CutPrefix(model, k+":"); ok {
			return k, r
		}
	}
	return BackendClaude, model
}

// ACPAgents are the agents a model acp:<agent>[:<model>] may name.
var ACPAgents = []string{"opencode", "claude", "gemini"}

// SplitACPModel splits what follows acp: into its agent, one of
// ACPAgents, and its model (empty for the agent's own default).
func SplitACPModel(s string) (agent, model string, err error) {
	agent, model, _ = strings.Cut(s, ":")
	if !slices.Contains(ACPAgents, agent) {
		// Kaimon's words (without Julia's "ArgumentError: "), then how a
		// model names one.
		return "", "", Errf(CodeInvalid, "unknown ACP agent '%s' — known: claude, gemini, opencode (a model acp:<agent>[:<model>], not acp:%s)", agent, s)
	}
	return agent, model, nil
}

// CheckModel refuses a model that names its backend wrongly (a wrong
// request, not a fleet without room): an ACP agent Shoal does not know,
// or a local model server's model left out. Any other model goes to the
// claude CLI, which judges it.
func CheckModel(model string) error {
	kind, rest := Route(model)
	switch kind {
	case BackendACP:
		_, _, err := SplitACPModel(rest)
		return err
	case BackendVMLX, BackendOllama:
		if rest == "" {
			return Errf(CodeInvalid, "model %q names no model: %s:<model>", model, kind)
		}
	}
	return nil
}

// ServesModel matches a tag against a model server's models, an untagged
// name standing for ":latest".
func ServesModel(models []string, tag string) bool {
	if slices.Contains(models, tag) {
		return true
	}
	if !strings.Contains(tag, ":") {
		return slices.Contains(models, tag+":latest")
	}
	return false
}
