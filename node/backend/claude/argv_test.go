package claude

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

func policy(t *testing.T, preset, mode string, allowed []string, disallowed *[]string, only bool) schemas.Policy {
	t.Helper()
	p, err := schemas.ComposePolicy(preset, mode, allowed, disallowed, only)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanKaimonOrder(t *testing.T) {
	dir := t.TempDir()
	spec := backend.Spec{
		AgentID: "a1", CWD: "/work", Model: "claude-sonnet-5/high", Dir: dir,
		Policy:       policy(t, "bypass", "", []string{"Read"}, nil, false),
		SystemPrompt: "be brief", MCP: backend.MCPEndpoint{URL: "http://127.0.0.1:7777/mcp", Token: "tok"},
	}
	l, err := Plan(spec, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
		"--model", "claude-sonnet-5", "--permission-mode", "bypassPermissions", "--add-dir", "/work",
		"--include-partial-messages", "--effort", "high",
		"--allowedTools", "Read",
		"--disallowedTools"}
	want = append(want, schemas.RecursionGuard...)
	want = append(want, "--dangerously-skip-permissions",
		"--mcp-config", filepath.Join(dir, "a1-mcp.json"), "--strict-mcp-config",
		"--append-system-prompt", "be brief")
	if !slices.Equal(l.Args, want) {
		t.Fatalf("args\n got %q\nwant %q", l.Args, want)
	}
	var cfg struct {
		MCPServers map[string]struct {
			Type       string            `json:"type"`
			URL        string            `json:"url"`
			Headers    map[string]string `json:"headers"`
			AlwaysLoad bool              `json:"alwaysLoad"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(l.MCPConfig, &cfg); err != nil {
		t.Fatal(err)
	}
	s := cfg.MCPServers["shoal"]
	if s.Type != "http" || s.URL != "http://127.0.0.1:7777/mcp" || s.Headers[schemas.AgentIDHeader] != "a1" || s.Headers["Authorization"] != "Bearer tok" || !s.AlwaysLoad {
		t.Fatalf("MCP config %s", l.MCPConfig)
	}
}

func TestPlanDefaults(t *testing.T) {
	l, err := Plan(backend.Spec{AgentID: "a", CWD: "/w", Policy: policy(t, "", "", nil, nil, false)}, false)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(l.Args, " ")
	for _, want := range []string{"--model sonnet", "--permission-mode acceptEdits", "--disallowedTools " + schemas.MCPToolPrefix + "agent_open"} {
		if !strings.Contains(joined, want) {
			t.Errorf("args %q lack %q", joined, want)
		}
	}
	for _, absent := range []string{"--include-partial-messages", "--effort", "--mcp-config", "--tools", "--allowedTools", "--dangerously"} {
		if strings.Contains(joined, absent) {
			t.Errorf("args %q have %q", joined, absent)
		}
	}
	// An explicit effort overrides the suffix; an empty suffix is none.
	l, _ = Plan(backend.Spec{CWD: "/w", Model: "sonnet/low", Effort: "medium"}, true)
	if !slices.Contains(l.Args, "medium") || slices.Contains(l.Args, "low") {
		t.Errorf("args %q", l.Args)
	}
	l, _ = Plan(backend.Spec{CWD: "/w", Model: "opus/"}, true)
	if slices.Contains(l.Args, "--effort") || !slices.Contains(l.Args, "opus") {
		t.Errorf("args %q", l.Args)
	}
	if _, err := Plan(backend.Spec{CWD: "/w", Effort: "extreme"}, true); err == nil || !strings.Contains(err.Error(), `unknown effort "extreme"`) {
		t.Errorf("bad effort: %v", err)
	}
	// disallowed_tools [] lifts the guard.
	none := []string{}
	l, _ = Plan(backend.Spec{CWD: "/w", Policy: policy(t, "", "", nil, &none, false)}, true)
	if slices.Contains(l.Args, "--disallowedTools") {
		t.Errorf("empty disallowed_tools still passed the guard: %q", l.Args)
	}
	// notebook denies the native tools on top of the guard and allows Shoal's server.
	l, _ = Plan(backend.Spec{CWD: "/w", Policy: policy(t, "notebook", "", nil, nil, false)}, true)
	joined = strings.Join(l.Args, " ")
	if !strings.Contains(joined, "--allowedTools mcp__shoal") || !strings.Contains(joined, "Bash Read Write Edit Glob Grep NotebookEdit") {
		t.Errorf("notebook args %q", joined)
	}
}

// With only, allowed_tools is the whole tool set: --tools names just the
// built-ins (ToolSearch when MCP tools are named) and only Shoal's MCP
// server is loaded.
func TestPlanOnly(t *testing.T) {
	dir := t.TempDir()
	mcp := backend.MCPEndpoint{URL: "http://127.0.0.1:1/mcp"}
	spec := backend.Spec{AgentID: "o", CWD: "/w", Dir: dir, MCP: mcp,
		Policy: policy(t, "default", "", []string{"Read", "Bash(git *)", schemas.MCPToolPrefix + "agent_list"}, nil, true)}
	l, err := Plan(spec, true)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.Index(l.Args, "--tools")
	if i < 0 || l.Args[i+1] != "Read,Bash,ToolSearch" {
		t.Fatalf("--tools in %q, want Read,Bash,ToolSearch", l.Args)
	}
	j := slices.Index(l.Args, "--allowedTools")
	if j < 0 || !slices.Equal(l.Args[j+1:j+4], []string{"Read", "Bash(git *)", schemas.MCPToolPrefix + "agent_list"}) {
		t.Fatalf("--allowedTools in %q", l.Args)
	}
	k := slices.Index(l.Args, "--mcp-config")
	if k < 0 || l.Args[k+1] != filepath.Join(dir, "o-mcp.json") || l.Args[k+2] != "--strict-mcp-config" {
		t.Fatalf("--mcp-config in %q: only Shoal's server", l.Args)
	}
	// Only built-ins: no ToolSearch. Nothing allowed: no tools at all.
	spec.Policy = policy(t, "default", "", []string{"Read"}, nil, true)
	l, _ = Plan(spec, true)
	if i := slices.Index(l.Args, "--tools"); l.Args[i+1] != "Read" {
		t.Errorf("--tools %q", l.Args[i+1])
	}
	spec.Policy = policy(t, "default", "", nil, nil, true)
	l, _ = Plan(spec, true)
	if i := slices.Index(l.Args, "--tools"); i < 0 || l.Args[i+1] != "" {
		t.Errorf("no allowed tools: args %q, want --tools \"\"", l.Args)
	}
}

func TestPlanOnlyRefusals(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "mine.json")
	os.WriteFile(cfg, []byte(`{"mcpServers":{}}`), 0o600)
	_, err := Plan(backend.Spec{CWD: "/w", MCPConfig: cfg, MCP: backend.MCPEndpoint{URL: "http://x/mcp"},
		Policy: policy(t, "default", "", []string{"Read"}, nil, true)}, true)
	if err == nil || !strings.Contains(err.Error(), "only refuses a caller-supplied mcp_config") {
		t.Errorf("caller mcp_config with only: %v", err)
	}
	_, err = Plan(backend.Spec{CWD: "/w", Policy: policy(t, "default", "", []string{schemas.MCPToolPrefix + "agent_list"}, nil, true)}, true)
	if err == nil || !strings.Contains(err.Error(), "MCP endpoint") {
		t.Errorf("MCP tools without an endpoint: %v", err)
	}
	// Without only, a caller's config joins Shoal's, as the checked copy.
	l, err := Plan(backend.Spec{AgentID: "c", CWD: "/w", Dir: t.TempDir(), MCPConfig: cfg, MCP: backend.MCPEndpoint{URL: "http://x/mcp"},
		Policy: policy(t, "default", "", nil, nil, false)}, true)
	if err != nil {
		t.Fatal(err)
	}
	k := slices.Index(l.Args, "--mcp-config")
	if l.Args[k+2] != l.CallerConfigPath || l.Args[k+3] != "--strict-mcp-config" {
		t.Errorf("args %q", l.Args)
	}
	if _, err := Plan(backend.Spec{CWD: "/w", MCPConfig: "/nope.json"}, true); err == nil || !strings.Contains(err.Error(), "/nope.json") {
		t.Errorf("missing mcp_config: %v", err)
	}
}

func TestTranscriptPath(t *testing.T) {
	if got := Transcript("/home/u/.claude", "/tmp/peers.work", "abc"); got != "/home/u/.claude/projects/-tmp-peers-work/abc.jsonl" {
		t.Errorf("got %q", got)
	}
	if Transcript("/home/u", "/tmp", "") != "" {
		t.Error("a transcript without a session id")
	}
}

// The CLI takes a backslash in its directory's path for a separator,
// finds no such directory and exits at its first turn: Plan refuses it.
func TestPlanRefusesADirectoryWithABackslash(t *testing.T) {
	_, err := Plan(backend.Spec{CWD: `/w/a\b`, Policy: policy(t, "default", "", nil, nil, false)}, true)
	if err == nil || !strings.Contains(err.Error(), `cannot work in "/w/a\\b"`) {
		t.Errorf("a directory with a backslash: %v", err)
	}
}

// Without an MCP config of Shoal's (a node that knows no endpoint) the
// CLI is still held to the servers it is given, none: it would load its
// user's own, an entry for the coordinator among them.
func TestPlanHoldsTheCLIToShoalsMCPServers(t *testing.T) {
	l, err := Plan(backend.Spec{CWD: "/w", Policy: policy(t, "default", "", nil, nil, false)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(l.Args, "--strict-mcp-config") || slices.Contains(l.Args, "--mcp-config") {
		t.Errorf("args without an MCP endpoint: %q", l.Args)
	}
}
