package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/peers"
)

// shoal up's MCP endpoint passes the MCP conformance suite (pinned, run by
// its own Node.js): every server scenario of its active set but those in
// testdata/conformance-baseline.yml, which need the suite's reference
// server's own tools, resources and prompts. A baseline entry that starts
// passing fails the run too, so the baseline stays true.
func TestMCPConformance(t *testing.T) {
	t.Parallel()
	suite := peers.Conformance.Command(t)
	up := startShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0")
	url := strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint ")
	up.waitLine("shoal: ready")
	baseline, err := filepath.Abs(filepath.Join("testdata", "conformance-baseline.yml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, suite[0], append(suite[1:], "server", "--url", url, "--expected-failures", baseline)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(baseEnv(t.TempDir()), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	summary := string(out)
	if i := strings.Index(summary, "=== SUMMARY ==="); i >= 0 {
		summary = summary[i:]
	}
	if err != nil || !strings.Contains(summary, "Baseline check passed") {
		t.Fatalf("the conformance suite against %s: %v\n%s", url, err, summary)
	}
	for _, want := range []string{"server-initialize", "logging-set-level", "completion-complete", "ping", "tools-list", "dns-rebinding-protection"} {
		if !strings.Contains(summary, "✓ "+want+":") {
			t.Errorf("the suite did not pass %s:\n%s", want, summary)
		}
	}
}
