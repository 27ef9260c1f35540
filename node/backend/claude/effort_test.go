package claude

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node/backend"
)

// The efforts Shoal takes are those the pinned CLI's --effort takes, as
// its help lists them: xhigh and max were refused, though the CLI runs
// them (and Kaimon passes any effort through).
func TestEffortsAreTheCLIs(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), peers.Claude.Command(t)[0], "--help")
	cmd.Env = peers.ClaudeEnv(t.TempDir(), "http://127.0.0.1:9")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("claude --help: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`--effort <level>[^(]*\(([^)]*)\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("claude --help names no efforts:\n%s", out)
	}
	cli := strings.Split(strings.Join(strings.Fields(string(m[1])), ""), ",")
	if !slices.Equal(cli, Efforts) {
		t.Errorf("the CLI's efforts are %v; Shoal takes %v", cli, Efforts)
	}
	for _, e := range cli {
		l, err := Plan(backend.Spec{CWD: "/w", Model: "opus/" + e}, true)
		if err != nil || !slices.Contains(l.Args, e) {
			t.Errorf("effort %s: %v, args %q", e, err, l.Args)
		}
	}
}
