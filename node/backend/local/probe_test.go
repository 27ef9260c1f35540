package local_test

import (
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/node/backend/local"
)

func TestOllamaModels(t *testing.T) {
	s := fakemodel.Start(t, fakemodel.Config{Models: []string{"qwen2.5:14b", "llama3:latest"}})
	got, err := local.OllamaModels(t.Context(), s.URL())
	if err != nil || !slices.Equal(got, []string{"qwen2.5:14b", "llama3:latest"}) {
		t.Fatalf("models %v %v", got, err)
	}
	if _, err := local.OllamaModels(t.Context(), "http://127.0.0.1:1"); err == nil {
		t.Fatal("no error for a server that is not there")
	}
}

func TestOllamaHost(t *testing.T) {
	for in, want := range map[string]string{
		"": "http://127.0.0.1:11434", "0.0.0.0": "http://0.0.0.0:11434", "gpu:1234": "http://gpu:1234",
		"http://gpu:11434/": "http://gpu:11434", "https://o.example": "https://o.example:11434",
	} {
		if got := local.OllamaHost(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenAIModels(t *testing.T) {
	s := fakemodel.Start(t, fakemodel.Config{MLX: true, Models: []string{"mlx-community/Qwen3-8B-4bit"}})
	got, err := local.OpenAIModels(t.Context(), s.URL())
	if err != nil || !slices.Equal(got, []string{"mlx-community/Qwen3-8B-4bit"}) {
		t.Fatalf("models %v %v", got, err)
	}
	for in, want := range map[string]string{"": "http://127.0.0.1:8000", "mac:8080": "http://mac:8080", "http://mac:8000/v1/": "http://mac:8000"} {
		if got := local.VMLXHost(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}
