package acp

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// mutating are the words that mark a tool the auto preset refuses over
// ACP, matched anywhere in the tool's bare name (run_shell_command,
// MultiEdit and fs/write_text_file all count).
var mutating = []string{"write", "edit", "patch", "bash", "shell", "run", "delete", "move"}

// kindTools maps an ACP tool kind to the claude CLI tools a deny list
// names for it, for permission requests whose title says nothing.
var kindTools = map[schemas.ToolKind][]string{
	schemas.ToolRead:    {"Read"},
	schemas.ToolEdit:    {"Edit", "Write"},
	schemas.ToolDelete:  {"Write"},
	schemas.ToolMove:    {"Write"},
	schemas.ToolExecute: {"Bash"},
	schemas.ToolSearch:  {"Grep", "Glob"},
}

// decide judges a tool an ACP agent wants to use, by name, the way
// Kaimon's _acp_decide does, case-insensitively: a deny entry wins; a
// caller's allowlist is the agent's whole world; the preset's own
// allowance passes; then the preset decides. why says what refused it.
func decide(pol schemas.Policy, tool string) (allow bool, why string) {
	name := splitName(tool)
	for _, e := range pol.Disallowed {
		if matchesDeny(e, name) {
			return false, "denied by policy"
		}
	}
	if len(pol.CallerAllowed) > 0 && !slices.ContainsFunc(pol.CallerAllowed, func(e string) bool { return matches(e, name) }) {
		return false, "not in this agent's allowlist"
	}
	if slices.ContainsFunc(pol.PresetAllowed, func(e string) bool { return matches(e, name) }) {
		return true, ""
	}
	switch pol.Preset {
	case schemas.PresetBypass, schemas.PresetLab, schemas.PresetDefault:
		return true, ""
	case schemas.PresetNotebook:
		return false, "the notebook preset has no shell or file tools: use Shoal's tools (" + schemas.MCPToolPrefix + "*), or open the agent with another preset for file access"
	case schemas.PresetSpecialist:
		if len(pol.CallerAllowed) == 0 {
			return false, "a specialist with no allowlist may call nothing"
		}
		return true, ""
	case schemas.PresetAuto:
		for _, w := range mutating {
			if strings.Contains(name.bare, w) {
				return false, "the auto preset cannot consult a classifier over ACP"
			}
		}
		return true, ""
	}
	return false, fmt.Sprintf("unknown permission preset %q", pol.Preset)
}

// deniedAtAsk checks a session/request_permission against the deny list,
// as Kaimon's _denied_tool does: the first word of the title, unless it
// looks like a qualified tool name or a path ("__", "/", ".", shoal_…:
// decide and the MCP door judge those), then the claude CLI tools the
// call's kind stands for. It returns the deny entry that matched.
func deniedAtAsk(deny []string, title, kind string) (entry string, denied bool) {
	if words := strings.Fields(title); len(words) > 0 {
		w := words[0]
		qualified := strings.Contains(w, "__") || strings.ContainsAny(w, "/.") ||
			strings.HasPrefix(strings.ToLower(w), schemas.MCPServerName+"_")
		if e, ok := firstDeny(deny, splitName(w)); ok && !qualified {
			return e, true
		}
	}
	for _, tool := range kindTools[schemas.ToolKind(strings.ToLower(strings.TrimSpace(kind)))] {
		if e, ok := firstDeny(deny, splitName(tool)); ok {
			return e, true
		}
	}
	return "", false
}

func firstDeny(deny []string, name toolName) (string, bool) {
	for _, e := range deny {
		if matchesDeny(e, name) {
			return e, true
		}
	}
	return "", false
}

// callPaths returns the paths a tool call names: the rawInput values under
// a key that contains "path" or is file, cwd, dir or directory (a string
// or a list of strings; keys in any case), then the locations' paths, each
// once. A shell command string is never parsed for paths.
func callPaths(rawInput json.RawMessage, locations []string) []string {
	var found []string
	var input map[string]json.RawMessage
	if json.Unmarshal(rawInput, &input) == nil {
		for _, k := range slices.Sorted(maps.Keys(input)) {
			if isPathKey(k) {
				found = append(found, stringOrStrings(input[k])...)
			}
		}
	}
	for _, l := range locations {
		if l != "" {
			found = append(found, l)
		}
	}
	var out []string
	for _, p := range found {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// toolName is a tool's name, lower-cased, split into the MCP server that
// serves it ("" for the agent's own tools) and its bare name.
type toolName struct{ server, bare string }

// splitName splits mcp__<server>__<tool>, and opencode's spelling of
// Shoal's tools, shoal_<tool>; any other name is the agent's own.
func splitName(tool string) toolName {
	n := strings.ToLower(strings.TrimSpace(tool))
	if rest, ok := strings.CutPrefix(n, "mcp__"); ok {
		if s, t, ok := strings.Cut(rest, "__"); ok && s != "" && t != "" {
			return toolName{s, t}
		}
	}
	if t, ok := strings.CutPrefix(n, schemas.MCPServerName+"_"); ok && t != "" {
		return toolName{schemas.MCPServerName, t}
	}
	return toolName{"", n}
}

// matches reports whether a policy entry names a tool. A server entry
// (mcp__shoal) matches only that server's tools, never the agent's own;
// a qualified entry matches that server's tool or the agent's own tool of
// that name; a bare entry matches a tool of that name on any server. An
// entry ending in '*' is a prefix of the qualified name (mcp__…) or of
// the bare name.
func matches(entry string, name toolName) bool {
	e := strings.ToLower(strings.TrimSpace(entry))
	if t, ok := strings.CutPrefix(e, schemas.MCPServerName+"_"); ok {
		e = schemas.MCPToolPrefix + t
	}
	if prefix, ok := strings.CutSuffix(e, "*"); ok {
		if schemas.IsMCPTool(prefix) {
			return name.server != "" && strings.HasPrefix("mcp__"+name.server+"__"+name.bare, prefix)
		}
		return strings.HasPrefix(name.bare, prefix)
	}
	if server, ok := strings.CutPrefix(e, "mcp__"); ok && !strings.Contains(server, "__") {
		return server != "" && name.server == server
	}
	en := splitName(e)
	if en.server != "" {
		return en.bare == name.bare && (name.server == "" || name.server == en.server)
	}
	return en.bare == name.bare
}

// matchesDeny is matches for a deny entry, where the claude CLI's argument
// pattern is dropped: ACP cannot see a call's arguments, so "Bash(rm *)"
// denies Bash. (An allow entry keeps its pattern and so allows nothing
// here: both err on the side of refusing.)
func matchesDeny(entry string, name toolName) bool {
	if tool, _, ok := strings.Cut(entry, "("); ok && strings.HasSuffix(strings.TrimSpace(entry), ")") {
		entry = tool
	}
	return matches(entry, name)
}
