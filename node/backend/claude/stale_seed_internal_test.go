package claude

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/node/backend"
)

// An agent's config directory outlives its lives: a sandboxed agent
// whose node, of an earlier version, copied the user's .claude.json into
// it has that copy removed at its next life (an outside reader found it
// kept).
func TestAnUpgradedNodeLeavesNoEarlierCopyOfTheUsersClaudeJSON(t *testing.T) {
	cfg := t.TempDir()
	secret := `{"mcpServers":{"gh":{"env":{"GITHUB_TOKEN":"ghp_USER_SECRET"}}}}`
	os.WriteFile(filepath.Join(cfg, ".claude.json"), []byte(secret), 0o600)
	os.WriteFile(filepath.Join(cfg, "settings.json"), []byte(`{}`), 0o600)
	spec := backend.Spec{AgentID: "old", Dir: t.TempDir()}
	// What the node before the change left in the agent's own directory.
	dst := backend.AgentHome(spec, "claude")
	os.MkdirAll(dst, 0o700)
	os.WriteFile(filepath.Join(dst, ".claude.json"), []byte(secret), 0o600)
	// The agent's next life, on the upgraded node.
	if _, err := SandboxConfigDir(spec, []string{"CLAUDE_CONFIG_DIR=" + cfg}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, ".claude.json")); err == nil && strings.Contains(string(b), "ghp_USER_SECRET") {
		t.Errorf("the reopened sandboxed agent's config directory still holds the user's .claude.json copied by the node before the upgrade")
	}
}
