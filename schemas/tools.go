package schemas

import (
	"fmt"
	"slices"
	"strings"
)

// ToolName is a tool as a policy judges it: the MCP server that serves it
// ("" for an agent's own tools) and its bare name, both lower-cased.
type ToolName struct{ Server, Bare string }

// ParseToolName reads mcp__<server>__<tool>, and opencode's spelling of
// Shoal's tools (shoal_<tool>); any other name is the agent's own tool.
func ParseToolName(tool string) ToolName {
	n := strings.ToLower(strings.TrimSpace(tool))
	if rest, ok := strings.CutPrefix(n, "mcp__"); ok {
		if s, t, ok := strings.Cut(rest, "__"); ok && s != "" && t != "" {
			return ToolName{s, t}
		}
	}
	if t, ok := strings.CutPrefix(n, MCPServerName+"_"); ok && t != "" {
		return ToolName{MCPServerName, t}
	}
	return ToolName{"", n}
}

// ShoalTool names one of Shoal's own MCP tools by its bare name.
func ShoalTool(bare string) ToolName {
	return ToolName{MCPServerName, strings.ToLower(bare)}
}

// MatchEntry reports whether a policy entry names a tool, in any case, by
// the entry forms Kaimon documents: a server entry (mcp__shoal) names that
// server's tools, never an agent's own; a qualified entry (mcp__shoal__x,
// or opencode's shoal_x) names that server's tool, or the agent's own tool
// of that name; a bare entry (x) names a tool of that name on any server
// or the agent's own; an entry ending in '*' is a prefix of the qualified
// name (mcp__shoal__agent_*) or of the bare one (agent_*). The door,
// ACP agents and local models all judge by it.
func MatchEntry(entry string, name ToolName) bool {
	e := strings.ToLower(strings.TrimSpace(entry))
	if e == "" {
		return false
	}
	if t, ok := strings.CutPrefix(e, MCPServerName+"_"); ok {
		e = MCPToolPrefix + t
	}
	if prefix, ok := strings.CutSuffix(e, "*"); ok {
		if IsMCPTool(prefix) {
			return name.Server != "" && strings.HasPrefix("mcp__"+name.Server+"__"+name.Bare, prefix)
		}
		return strings.HasPrefix(name.Bare, prefix)
	}
	if server, ok := strings.CutPrefix(e, "mcp__"); ok && !strings.Contains(server, "__") {
		return server != "" && name.Server == server
	}
	en := ParseToolName(e)
	if en.Server != "" {
		return en.Bare == name.Bare && (name.Server == "" || name.Server == en.Server)
	}
	return en.Bare == name.Bare
}

// MatchDeny is MatchEntry for a deny entry, the claude CLI's argument
// pattern dropped: where a call's arguments cannot be judged,
// "Bash(rm *)" denies Bash, which errs on the side of refusing.
func MatchDeny(entry string, name ToolName) bool {
	if tool, _, ok := strings.Cut(entry, "("); ok && strings.HasSuffix(strings.TrimSpace(entry), ")") {
		entry = tool
	}
	return MatchEntry(entry, name)
}

// Rules say whose rules decide a tool call after the deny list.
type Rules int

const (
	// MCPRules judge a call of an MCP tool (Shoal's door, a local model's
	// tools): a deny entry wins; under only and the specialist preset the
	// allowlist is the whole tool set, an empty one allowing nothing;
	// anything else is allowed.
	MCPRules Rules = iota
	// ACPRules are Kaimon's for ACP agents (_acp_decide): a deny entry
	// wins; a caller's allowlist is the agent's whole world; the preset's
	// own allowance passes; then the preset decides.
	ACPRules
)

// autoRefused are the words that mark a tool the auto preset refuses under
// ACPRules, matched anywhere in the tool's bare name (run_shell_command,
// MultiEdit and fs/write_text_file all count).
var autoRefused = []string{"write", "edit", "patch", "bash", "shell", "run", "delete", "move"}

// Decide judges a call of tool under the policy by rules. why says what
// refused it.
func (p Policy) Decide(tool ToolName, rules Rules) (allow bool, why string) {
	for _, e := range p.Disallowed {
		if MatchDeny(e, tool) {
			if rules == ACPRules {
				return false, "denied by policy"
			}
			if slices.Contains(RecursionGuard, e) {
				return false, "the recursion guard keeps agents from opening, driving, closing or looking up agents (open this agent with disallowed_tools [] to allow it)"
			}
			return false, "denied by this agent's policy (" + e + ")"
		}
	}
	named := func(list []string) bool {
		return slices.ContainsFunc(list, func(e string) bool { return MatchEntry(e, tool) })
	}
	if rules == MCPRules {
		if p.Only || p.Preset == PresetSpecialist {
			switch {
			case named(p.Allowed):
				return true, ""
			case len(p.Allowed) == 0:
				return false, "this agent's tool set is empty, so it may call nothing"
			}
			return false, "not in this agent's allowlist"
		}
		return true, ""
	}
	if len(p.CallerAllowed) > 0 && !named(p.CallerAllowed) {
		return false, "not in this agent's allowlist"
	}
	if named(p.PresetAllowed) {
		return true, ""
	}
	switch p.Preset {
	case PresetBypass, PresetLab, PresetDefault:
		return true, ""
	case PresetNotebook:
		return false, "the notebook preset has no shell or file tools: use Shoal's tools (" + MCPToolPrefix + "*), or open the agent with another preset for file access"
	case PresetSpecialist:
		if len(p.CallerAllowed) == 0 {
			return false, "a specialist with no allowlist may call nothing"
		}
		return true, ""
	case PresetAuto:
		for _, w := range autoRefused {
			if strings.Contains(tool.Bare, w) {
				return false, "the auto preset cannot consult a classifier over ACP"
			}
		}
		return true, ""
	}
	return false, fmt.Sprintf("unknown permission preset %q", p.Preset)
}

// Policy is the policy the record carries, for Decide: the composed
// allowlist is the whole one, as the door judges it.
func (p AgentPolicy) Policy() Policy {
	return Policy{Preset: p.Preset, Allowed: p.AllowedTools, Disallowed: p.DisallowedTools, Only: p.Only, Ask: p.Ask}
}

// DecideTool judges an agent's call of one of Shoal's own MCP tools, by
// its bare name ("agent_open"), by MCPRules.
func (p AgentPolicy) DecideTool(tool string) (ok bool, why string) {
	return p.Policy().Decide(ShoalTool(tool), MCPRules)
}
