package main

import (
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// shoal nodes counts a server's models in words that agree with the
// count: it said "vmlx(1 models)".
func TestNodesCountModels(t *testing.T) {
	got := runs([]schemas.BackendInfo{
		{Kind: "vmlx", Ready: true, Models: []string{"a"}},
		{Kind: "ollama", Ready: true, Models: []string{"a", "b"}},
		{Kind: "claude", Ready: false},
	})
	if want := "vmlx(1 model),ollama(2 models),[claude]"; got != want {
		t.Errorf("runs: %q, want %q", got, want)
	}
}
