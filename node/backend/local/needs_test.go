package local

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/node/backend"
)

// The variables a stdio server's configuration names reach its sandbox
// by name; a key that is a pattern ("*", the node's whole environment)
// does not widen it.
func TestSandboxNeedsTakeNoEnvironmentPattern(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "mcp.json")
	os.WriteFile(cfg, []byte(`{"mcpServers":{"x":{"command":"/bin/sh","args":["-c","true"],"env":{"*":"","TOKEN_FOR_X":"t","ALL_*":""}}}}`), 0o600)
	b, err := New(Config{Kind: "ollama", Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := b.SandboxNeeds(backend.Spec{AgentID: "a1", CWD: t.TempDir(), MCPConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(n.Env, "TOKEN_FOR_X") || slices.Contains(n.Env, "*") || slices.Contains(n.Env, "ALL_*") {
		t.Errorf("the sandbox's variables from the configuration: %q; want TOKEN_FOR_X and no pattern", n.Env)
	}
}
