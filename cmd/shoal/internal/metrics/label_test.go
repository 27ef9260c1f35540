package metrics

import (
	"strings"
	"testing"
)

// A model's name is its own label; what an open's caller gave that is no
// model's name (free text, escapes, a long string) is "other".
func TestModelLabel(t *testing.T) {
	for model, want := range map[string]string{
		"sonnet":                 "sonnet",
		"claude-sonnet-5/high":   "claude-sonnet-5/high",
		"ollama:qwen3:8b":        "ollama:qwen3:8b",
		"mlx-community/Qwen3@4b": "mlx-community/Qwen3@4b",
		"":                       "other",
		"sonnet\x1b]0;x\x07":     "other",
		"my secret prompt":       "other",
		strings.Repeat("a", 65):  "other",
	} {
		if got := modelLabel(model); got != want {
			t.Errorf("modelLabel(%q) = %q, want %q", model, got, want)
		}
	}
}
