package local

import (
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/node/backend"
)

// A switch to a model the server does not serve is refused, naming what
// it serves, as an open of it is; one it serves (prefixed, bare, or
// untagged for :latest) is taken. Before, any name was taken and every
// later turn failed at the server.
func TestSetModelTakesOnlyAModelTheServerServes(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			fake := fakemodel.Start(t, fakemodel.Config{MLX: d.mlx, Models: []string{"qwen3:8b", "llama3.2:latest"}})
			sess, _ := startLocal(t, d.kind, fake, policy(t, "default"))
			ms := sess.(backend.ModelSetter)
			if _, err := ms.SetModel(t.Context(), d.kind+":nonexistent:7b"); err == nil || !strings.Contains(err.Error(), `does not serve model "nonexistent:7b"`) || !strings.Contains(err.Error(), "qwen3:8b") {
				t.Errorf("a switch to a model the server lacks: %v", err)
			}
			for _, m := range []string{d.kind + ":qwen3:8b", "qwen3:8b", "llama3.2"} {
				if got, err := ms.SetModel(t.Context(), m); err != nil || !strings.HasPrefix(got, d.kind+":") {
					t.Errorf("a switch to %s, which the server serves: %q %v", m, got, err)
				}
			}
		})
	}
}
