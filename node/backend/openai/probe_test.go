package openai_test

import (
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/node/backend/openai"
)

func TestModels(t *testing.T) {
	s := fakemodel.Start(t, fakemodel.Config{MLX: true, Models: []string{"mlx-community/Qwen3-8B-4bit"}})
	got, err := openai.Models(t.Context(), s.URL())
	if err != nil || !slices.Equal(got, []string{"mlx-community/Qwen3-8B-4bit"}) {
		t.Fatalf("models %v %v", got, err)
	}
	for in, want := range map[string]string{"": "http://127.0.0.1:8000", "mac:8080": "http://mac:8080", "http://mac:8000/v1/": "http://mac:8000"} {
		if got := openai.Host(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}
