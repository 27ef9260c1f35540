package claude

import (
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/peers"
)

// A claude CLI that is installed but not logged in answered every turn
// with "Not logged in · Please run /login", and its node called it ready:
// placement sent agents there. The CLI's own `auth status` says so, and
// the backend is not ready, saying why; logged in (an API key here), it is.
func TestDescribeSaysTheCLIIsNotLoggedIn(t *testing.T) {
	path := peers.Claude.Command(t)[0]
	env := peers.ClaudeEnv(t.TempDir(), "http://127.0.0.1:9")
	var without []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "ANTHROPIC_API_KEY=") {
			without = append(without, kv)
		}
	}
	if info := New(Config{Path: path, Env: env}).Describe(t.Context()); !info.Ready || info.Problem != "" {
		t.Errorf("a claude CLI with an API key: ready %v, problem %q", info.Ready, info.Problem)
	}
	info := New(Config{Path: path, Env: without}).Describe(t.Context())
	if info.Ready || !strings.Contains(info.Problem, "the claude CLI is not logged in") || info.Version == "" {
		t.Errorf("a claude CLI not logged in: ready %v, problem %q, version %q", info.Ready, info.Problem, info.Version)
	}
}
