package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A coordinator with authentication and no MCP token can give nodes with
// credentials no key for their agents (each node's is made from the
// token), so those agents get none of Shoal's tools: shoal up says so as
// it starts. Before, nothing said it anywhere (an outside review of
// local models on a remote node found every tool list empty).
func TestUpSaysNodesWithCredentialsGetNoToolsWithoutAToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		token []string
		warn  bool
	}{
		{"no token", nil, true},
		{"a token", []string{"--mcp-token", "sesame-sesame-sesame"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			up := startShoal(t, dir, nil, append([]string{"up", "--auth", "--auth-dir", filepath.Join(dir, "keys"), "--port", "-1", "--no-node", "--no-bus",
				"--mcp-listen", "127.0.0.1:0"}, tc.token...)...)
			up.waitLine("shoal: ready")
			// Stopped, so that all it wrote on stderr has been read (a
			// read as stdout said ready raced the warning's copy).
			up.stop(syscall.SIGTERM)
			said := strings.Join(up.stdoutLines(), "\n") + "\n" + up.stderrText()
			const words = "agents on nodes with credentials get none of Shoal's tools"
			if strings.Contains(said, words) != tc.warn {
				t.Errorf("shoal up %s: said %q: %v, want %v; it said:\n%s", tc.name, words, !tc.warn, tc.warn, said)
			}
		})
	}
}
