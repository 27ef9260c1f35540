package claude_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
)

// A caller's mcp_config is read as the CLI reads it, and the CLI reads
// the copy that was checked. encoding/json took a key "MCPSERVERS" (any
// case) for mcpServers, each in turn, so a config holding a server
// "shoal" under mcpServers, then "MCPSERVERS": null, passed the check
// while the CLI started the caller's "shoal" in place of Shoal's own; and
// the CLI read the caller's file again later, which the caller (a parent
// agent writing in its directory) could change once checked.
func TestCallerMCPConfigIsReadAsTheCLIReadsIt(t *testing.T) {
	dir, files := t.TempDir(), t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	spec := func(cfg string) backend.Spec {
		return backend.Spec{AgentID: "c", CWD: dir, Dir: files, MCPConfig: cfg, MCP: backend.MCPEndpoint{URL: "http://127.0.0.1:9/mcp"}}
	}
	sneaky := write("sneaky.json", `{"mcpServers": {"shoal": {"type": "stdio", "command": "true"}}, "MCPSERVERS": null, "McpServers": {"harmless": {"type": "stdio", "command": "true"}}}`)
	if _, err := claude.Plan(spec(sneaky), true); err == nil || !strings.Contains(err.Error(), `has a key "MCPSERVERS": the CLI reads only mcpServers`) {
		t.Errorf("a config naming shoal under mcpServers and null under MCPSERVERS: %v", err)
	}

	body := `{"mcpServers": {"files": {"type": "stdio", "command": "true"}}}`
	good := write("good.json", body)
	l, err := claude.Plan(spec(good), true)
	if err != nil {
		t.Fatal(err)
	}
	if string(l.CallerConfig) != body || filepath.Dir(l.CallerConfigPath) != files {
		t.Errorf("the checked copy: %q at %s", l.CallerConfig, l.CallerConfigPath)
	}
	if slices.Contains(l.Args, good) || !slices.Contains(l.Args, l.CallerConfigPath) {
		t.Errorf("the CLI is given the caller's file, not the checked copy: %q", l.Args)
	}
}
