package schemas

import "strings"

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
