package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// Efforts are the values --effort takes.
var Efforts = []string{"low", "medium", "high", "xhigh", "max"}

// SplitModel separates an inline effort suffix: "claude-sonnet-5/high" is
// model claude-sonnet-5 with effort high. The text after the last '/' is
// the effort ("" for none).
func SplitModel(model string) (name, effort string) {
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		return model[:i], model[i+1:]
	}
	return model, ""
}

// Launch is a planned invocation of the CLI: its arguments and the MCP
// config it needs written first.
type Launch struct {
	Args []string
	// MCPConfigPath and MCPConfig are the generated config, when there is one.
	MCPConfigPath string
	MCPConfig     []byte
	// CallerConfigPath and CallerConfig are the caller's mcp_config as it
	// was checked, written where the node keeps the agent's files: the
	// CLI reads that copy, not the caller's file, which may change once
	// checked.
	CallerConfigPath string
	CallerConfig     []byte
}

// Plan builds the CLI arguments for spec, in Kaimon's order:
//
//	-p --input-format stream-json --output-format stream-json --verbose
//	--model M --permission-mode P --add-dir CWD [--include-partial-messages]
//	[--effort E] [--tools T,…] [--allowedTools …] [--disallowedTools …]
//	[--dangerously-skip-permissions] [--mcp-config F… --strict-mcp-config]
//	[--append-system-prompt S]
//
// With Policy.Only, and for the specialist preset, the CLI gets --tools
// naming just the built-in tools of the allowlist (plus ToolSearch when it
// names MCP tools; an empty list when it names none) and only Shoal's MCP
// server; a caller's mcp_config is refused, and so is an allowlist naming
// MCP tools when the coordinator's MCP endpoint is unknown.
func Plan(spec backend.Spec, partial bool) (Launch, error) {
	if strings.ContainsRune(spec.CWD, '\\') {
		// The CLI takes a backslash for a Windows separator, finds no
		// such directory and exits at its first turn.
		return Launch{}, fmt.Errorf("the claude CLI cannot work in %q: it takes the backslash in its path for a separator and finds no such directory; open the agent in a directory whose path holds none", spec.CWD)
	}
	model, effort := SplitModel(spec.Model)
	if model == "" {
		model = schemas.DefaultModel
	}
	if spec.Effort != "" {
		effort = spec.Effort
	}
	if effort != "" && !slices.Contains(Efforts, effort) {
		return Launch{}, fmt.Errorf("unknown effort %q (want %s)", effort, strings.Join(Efforts, ", "))
	}
	pol := spec.Policy
	if pol.Mode == "" {
		pol.Mode = "acceptEdits"
	}
	namesMCP := slices.ContainsFunc(pol.Allowed, schemas.IsMCPTool)
	// A specialist's allowlist is its whole tool set, as only makes any
	// agent's: the CLI is handed exactly those tools, none when the list
	// is empty, so its own (cron, tasks, web fetch, skills) are not there.
	exact := pol.Only || pol.Preset == schemas.PresetSpecialist
	if pol.Only && spec.MCPConfig != "" {
		return Launch{}, errors.New("only refuses a caller-supplied mcp_config: Shoal tells an agent's MCP calls apart by the config it generates")
	}
	if exact && namesMCP && spec.MCP.URL == "" {
		return Launch{}, errors.New("an allowlist of MCP tools needs the coordinator's MCP endpoint, and this node does not know it")
	}
	args := []string{"-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
		"--model", model, "--permission-mode", pol.Mode, "--add-dir", spec.CWD}
	if partial {
		args = append(args, "--include-partial-messages")
	}
	if pol.Ask && !pol.Dangerous {
		// What the CLI would prompt for comes to Shoal as a control
		// request, and is put to a person; so do its commands, edits and
		// fetches that no allowlist entry names, even those it would
		// pass on its own (a read-only shell command).
		args = append(args, "--permission-prompt-tool", "stdio")
		if ask := askedTools(pol.Allowed); len(ask) > 0 {
			settings, _ := json.Marshal(map[string]any{"permissions": map[string]any{"ask": ask}})
			args = append(args, "--settings", string(settings))
		}
	}
	if effort != "" {
		args = append(args, "--effort", effort)
	}
	if exact {
		tools := schemas.BuiltinTools(pol.Allowed)
		if namesMCP && !slices.Contains(tools, "ToolSearch") {
			tools = append(tools, "ToolSearch")
		}
		args = append(args, "--tools", strings.Join(tools, ","))
	}
	if len(pol.Allowed) > 0 {
		args = append(append(args, "--allowedTools"), pol.Allowed...)
	}
	if len(pol.Disallowed) > 0 {
		args = append(append(args, "--disallowedTools"), pol.Disallowed...)
	}
	if pol.Dangerous {
		args = append(args, "--dangerously-skip-permissions")
	}
	var l Launch
	var configs []string
	if spec.MCP.URL != "" {
		l.MCPConfigPath = filepath.Join(spec.Dir, spec.AgentID+"-mcp.json")
		l.MCPConfig = mcpConfig(spec)
		configs = append(configs, l.MCPConfigPath)
	}
	if spec.MCPConfig != "" {
		b, err := checkMCPConfig(spec.MCPConfig)
		if err != nil {
			return Launch{}, err
		}
		l.CallerConfigPath, l.CallerConfig = callerConfigPath(spec), b
		configs = append(configs, l.CallerConfigPath)
	}
	if len(configs) > 0 {
		args = append(append(args, "--mcp-config"), configs...)
	}
	// Always: with no config of Shoal's the CLI would load the MCP servers
	// of the user the node runs as (and a project's .mcp.json), and an
	// agent would reach the coordinator's endpoint through the user's
	// entry for it as no agent at all, past the door's rules.
	args = append(args, "--strict-mcp-config")
	if spec.SystemPrompt != "" {
		args = append(args, "--append-system-prompt", spec.SystemPrompt)
	}
	l.Args = args
	return l, nil
}

// mcpConfig is the config that points the agent at the coordinator's MCP
// server, with the header that tells the door which agent is calling.
// alwaysLoad makes the CLI connect to it before its first request and
// offer its tools directly (not deferred behind ToolSearch): without it
// the CLI connects in the background, and a turn sent right after the
// open could go to the model without Shoal's tools.
func mcpConfig(spec backend.Spec) []byte {
	headers := map[string]string{schemas.AgentIDHeader: spec.AgentID}
	if spec.MCP.Token != "" {
		headers["Authorization"] = "Bearer " + spec.MCP.Token
	}
	b, _ := json.MarshalIndent(map[string]any{
		"mcpServers": map[string]any{
			schemas.MCPServerName: map[string]any{"type": "http", "url": spec.MCP.URL, "headers": headers, "alwaysLoad": true},
		},
	}, "", "  ")
	return b
}

// Transcript is where the CLI keeps its own transcript of a session:
// <config dir>/projects/<project dir>/<session>.jsonl, the config dir being
// $CLAUDE_CONFIG_DIR or ~/.claude (ConfigDir). The project dir is the CLI's
// own: realpath(cwd) with every character that is not an ASCII letter or
// digit replaced by '-' (per UTF-16 unit, as JavaScript counts them), cut
// to 200 characters and suffixed with a hash of the path when longer.
func Transcript(configDir, cwd, sessionID string) string {
	if sessionID == "" || configDir == "" {
		return ""
	}
	if real, err := filepath.EvalSymlinks(cwd); err == nil {
		cwd = real
	}
	return filepath.Join(configDir, "projects", ProjectDir(cwd), sessionID+".jsonl")
}

// ConfigDir is the claude CLI's configuration directory in env.
func ConfigDir(env []string) string {
	if d := proc.EnvValue(env, "CLAUDE_CONFIG_DIR"); d != "" {
		return d
	}
	if home := proc.EnvValue(env, "HOME"); home != "" {
		return filepath.Join(home, ".claude")
	}
	return ""
}

// SandboxConfigDir prepares a sandboxed agent's own config directory
// (CLAUDE_CONFIG_DIR, backend.AgentHome): the files at the top of the
// user's (settings, login, CLAUDE.md), copied afresh each life. The
// user's own directory is neither written nor read from inside: settings
// there name hooks that every later claude runs, and its projects, file
// history and shell snapshots are every other session's. A login
// refreshed inside stays inside.
func SandboxConfigDir(spec backend.Spec, env []string) (string, error) {
	dst := backend.AgentHome(spec, "claude")
	return dst, proc.SeedHome(dst, ConfigDir(env), backend.ClaudeNotSeeded...)
}

// askedTools are the CLI's acting tools no allowlist entry names, which
// an agent that asks always asks about.
func askedTools(allowed []string) []string {
	var out []string
	for _, tool := range []string{"Bash", "Edit", "Write", "MultiEdit", "NotebookEdit", "WebFetch"} {
		if !slices.ContainsFunc(schemas.BuiltinTools(allowed), func(t string) bool { return t == tool }) {
			out = append(out, tool)
		}
	}
	return out
}

// projectDirMax is the longest project directory name the CLI writes
// before it cuts the name and adds a hash.
const projectDirMax = 200

// ProjectDir is the CLI's name for a project's directory under projects/.
func ProjectDir(path string) string {
	units := utf16.Encode([]rune(path))
	b := make([]byte, len(units))
	for i, u := range units {
		if u < 0x80 && (u >= 'a' && u <= 'z' || u >= 'A' && u <= 'Z' || u >= '0' && u <= '9') {
			b[i] = byte(u)
		} else {
			b[i] = '-'
		}
	}
	if len(b) <= projectDirMax {
		return string(b)
	}
	var h int32
	for _, u := range units {
		h = h*31 + int32(u)
	}
	abs := int64(h)
	if abs < 0 {
		abs = -abs
	}
	return string(b[:projectDirMax]) + "-" + strconv.FormatInt(abs, 36)
}

// callerConfigPath is where the checked copy of spec's mcp_config is
// written: beside the generated one, in the node's files for the agent.
func callerConfigPath(spec backend.Spec) string {
	if spec.Dir == "" {
		return spec.MCPConfig // no files of the node's (a check alone)
	}
	return filepath.Join(spec.Dir, spec.AgentID+"-caller-mcp.json")
}

// checkMCPConfig reads a caller's mcp_config, a JSON object whose
// mcpServers is an object of servers, as the CLI takes it, and returns
// what it read. Its keys are read as the CLI reads them, in their case
// (encoding/json would take MCPSERVERS for mcpServers into a struct):
// a key that is mcpServers in another case is refused.
func checkMCPConfig(path string) ([]byte, error) {
	b, err := backend.ReadMCPConfig(path)
	if err != nil {
		if u := errors.Unwrap(err); u != nil {
			err = u
		}
		return nil, fmt.Errorf("mcp_config %s: %w", path, err)
	}
	var doc map[string]json.RawMessage
	var servers map[string]json.RawMessage
	err = json.Unmarshal(b, &doc)
	if err == nil {
		// In order, so that of two such keys the error names the same
		// one every time.
		for _, k := range slices.Sorted(maps.Keys(doc)) {
			if strings.EqualFold(k, "mcpServers") && k != "mcpServers" {
				return nil, fmt.Errorf("mcp_config %s has a key %q: the CLI reads only mcpServers, in that case; name it so", path, k)
			}
		}
		err = json.Unmarshal(doc["mcpServers"], &servers)
	}
	if err != nil || servers == nil {
		why := "it has no mcpServers object"
		if err != nil && doc == nil {
			why = err.Error()
		}
		return nil, fmt.Errorf("mcp_config %s is not an MCP configuration (a JSON object with an mcpServers object): %s", path, why)
	}
	for _, name := range slices.Sorted(maps.Keys(servers)) {
		s := servers[name]
		var server map[string]json.RawMessage
		if json.Unmarshal(s, &server) != nil {
			return nil, fmt.Errorf("mcp_config %s: server %q is not an object", path, name)
		}
		// Shoal's own server is the one its config names, with the
		// header that tells the door which agent calls: one of the
		// caller's by that name would stand in its place or beside it,
		// without that header (an agent's child made a person so).
		if strings.EqualFold(strings.TrimSpace(name), schemas.MCPServerName) {
			return nil, fmt.Errorf("mcp_config %s names a server %q, the name of Shoal's own: name it otherwise", path, name)
		}
	}
	return b, nil
}
