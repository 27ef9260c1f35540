package acp

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

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
// Kaimon's _acp_decide does (schemas.ACPRules).
func decide(pol schemas.Policy, tool string) (allow bool, why string) {
	return pol.Decide(schemas.ParseToolName(tool), schemas.ACPRules)
}

// askable reports whether one of opencode's tools changes something
// (runs a command, writes, fetches): what an agent that asks puts to a
// person. Its reads and searches are not asked about.
func askable(tool string) bool {
	t := strings.ToLower(tool)
	for _, p := range []string{"write", "edit", "patch", "bash", "shell", "run", "delete", "move", "webfetch"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// allowlisted reports whether the agent's caller named the tool in its
// allowlist: an agent that asks is not asked about those.
func allowlisted(pol schemas.Policy, tool string) bool {
	name := schemas.ParseToolName(tool)
	return slices.ContainsFunc(pol.CallerAllowed, func(e string) bool { return schemas.MatchEntry(e, name) })
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
		if e, ok := firstDeny(deny, schemas.ParseToolName(w)); ok && !qualified {
			return e, true
		}
	}
	for _, tool := range kindTools[schemas.ToolKind(strings.ToLower(strings.TrimSpace(kind)))] {
		if e, ok := firstDeny(deny, schemas.ParseToolName(tool)); ok {
			return e, true
		}
	}
	return "", false
}

func firstDeny(deny []string, name schemas.ToolName) (string, bool) {
	for _, e := range deny {
		if schemas.MatchDeny(e, name) {
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
