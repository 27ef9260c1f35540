package acp

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalfabric/shoal/node/backend"
)

// gemini keeps every MCP server's OAuth tokens in plain files in
// ~/.gemini (mcp-oauth-tokens.json, a2a-oauth-tokens.json): a sandboxed
// gemini agent's own home gets no copy of them, as a claude agent's gets
// none of .claude.json. An outside reader found them copied.
func TestSandboxedGeminiGetsNoCopyOfTheUsersMCPOAuthTokens(t *testing.T) {
	home := t.TempDir()
	dot := filepath.Join(home, ".gemini")
	if err := os.MkdirAll(dot, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"mcp-oauth-tokens.json", "a2a-oauth-tokens.json"} {
		os.WriteFile(filepath.Join(dot, f), []byte(`[{"serverName":"gh","token":{"accessToken":"USER-MCP-OAUTH-SECRET"}}]`), 0o600)
	}
	os.WriteFile(filepath.Join(dot, "settings.json"), []byte(`{}`), 0o600)
	spec := backend.Spec{AgentID: "g1", Dir: t.TempDir()}
	h, err := geminiHome(spec, []string{"HOME=" + home})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"mcp-oauth-tokens.json", "a2a-oauth-tokens.json"} {
		if _, err := os.Stat(filepath.Join(h, ".gemini", f)); err == nil {
			t.Errorf("the sandboxed gemini agent's home holds a copy of the user's %s (every MCP server's OAuth tokens)", f)
		}
	}
}
