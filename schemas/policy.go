package schemas

import (
	"fmt"
	"slices"
	"strings"
)

// MCPServerName is the name agents know the coordinator's MCP server by, so
// its tools reach them as mcp__shoal__<tool>.
const MCPServerName = "shoal"

// MCPToolPrefix qualifies a tool of Shoal's MCP server.
const MCPToolPrefix = "mcp__" + MCPServerName + "__"

// AgentIDHeader is the HTTP header that tells the MCP door which agent is
// calling; a node writes it into the MCP config it generates for an agent.
const AgentIDHeader = "X-Shoal-Agent-Id"

// Preset is a permission posture chosen with one word when an agent opens.
type Preset string

// The presets.
const (
	PresetDefault    Preset = "default"    // edits allowed, nothing extra
	PresetNotebook   Preset = "notebook"   // Shoal's tools instead of native file and shell tools
	PresetSpecialist Preset = "specialist" // the caller's allowed_tools are the whole tool set
	PresetLab        Preset = "lab"        // Shoal's whole MCP server plus ACP file access
	PresetAuto       Preset = "auto"       // the model's permission classifier decides
	PresetBypass     Preset = "bypass"     // no checks: sandboxed or trusted directories only
)

// Presets lists the presets in the order documentation gives them.
var Presets = []Preset{PresetDefault, PresetNotebook, PresetSpecialist, PresetLab, PresetAuto, PresetBypass}

// PermissionModes are the claude CLI's --permission-mode values a caller
// may set explicitly.
var PermissionModes = []string{"default", "acceptEdits", "plan", "auto", "bypassPermissions"}

// NativeFileTools are the agent's own file and shell tools that the
// notebook and specialist presets deny.
var NativeFileTools = []string{"Bash", "Read", "Write", "Edit", "Glob", "Grep", "NotebookEdit"}

// RecursionGuard is the default disallowed_tools, Kaimon's: an agent may
// not open, drive, close or look up other agents (agent_status,
// agent_list), nor multiply processes with the CLI's own sub-agent
// spawners. The reads of one agent's stream stay allowed, as Kaimon's
// agent_output does (agent_output, agent_events), and so does agent_nodes,
// which names machines, not agents. A caller lifts the guard with an
// explicit empty disallowed_tools.
var RecursionGuard = []string{
	MCPToolPrefix + "agent_open", MCPToolPrefix + "agent_send", MCPToolPrefix + "agent_run",
	MCPToolPrefix + "agent_interrupt", MCPToolPrefix + "agent_close", MCPToolPrefix + "agent_status",
	MCPToolPrefix + "agent_list", MCPToolPrefix + "agent_set_model", MCPToolPrefix + "agent_permit",
	"Agent", "Task", "Workflow",
}

// Policy is an agent's composed tool policy.
type Policy struct {
	Preset Preset
	// Mode is the claude CLI permission mode: the explicit one, else the preset's.
	Mode string
	// Allowed is the caller's allowed_tools with the preset's allowance
	// added (specialist: the caller's alone).
	Allowed []string
	// CallerAllowed is the caller's allowed_tools as given.
	CallerAllowed []string
	// PresetAllowed is what the preset allows on its own.
	PresetAllowed []string
	// Disallowed is the caller's disallowed_tools (the recursion guard by
	// default) with the preset's denials added; a preset can only add.
	Disallowed []string
	// Dangerous skips every permission check (the bypass preset).
	Dangerous bool
	// Only makes Allowed the agent's whole tool set.
	Only bool
	// Ask puts what the preset neither allows nor denies to a person
	// (the "ask" preset, or ask on another), instead of refusing it.
	Ask bool
}

// PresetAsk is the word for the default preset with Ask.
const PresetAsk = "ask"

// ParsePreset accepts a preset word in any case; "" is the default.
func ParsePreset(s string) (Preset, error) {
	p := Preset(strings.ToLower(strings.TrimSpace(s)))
	if p == "" || p == PresetAsk {
		return PresetDefault, nil
	}
	if slices.Contains(Presets, p) {
		return p, nil
	}
	return "", fmt.Errorf("unknown permission preset %q (want default, ask, notebook, specialist, lab, auto or bypass)", s)
}

// ComposePolicy combines a preset with the caller's overrides. disallowed
// nil means the recursion guard.
func ComposePolicy(preset, permissionMode string, allowed []string, disallowed *[]string, only bool) (Policy, error) {
	p, err := ParsePreset(preset)
	if err != nil {
		return Policy{}, err
	}
	pol := Policy{Preset: p, Mode: "acceptEdits", CallerAllowed: slices.Clone(allowed), Only: only,
		Ask: strings.EqualFold(strings.TrimSpace(preset), PresetAsk)}
	var deny []string
	switch p {
	case PresetNotebook:
		pol.PresetAllowed = []string{"mcp__" + MCPServerName}
		deny = NativeFileTools
	case PresetSpecialist:
		deny = NativeFileTools
	case PresetLab:
		pol.PresetAllowed = []string{"mcp__" + MCPServerName, "fs/read_text_file", "fs/write_text_file"}
	case PresetAuto:
		pol.Mode = "auto"
	case PresetBypass:
		pol.Mode = "bypassPermissions"
		pol.Dangerous = true
	}
	if pol.Ask && p == PresetDefault {
		// The ask preset: what the CLI would prompt for, edits included,
		// is put to a person.
		pol.Mode = "default"
	}
	if permissionMode != "" {
		if !slices.Contains(PermissionModes, permissionMode) {
			return Policy{}, fmt.Errorf("unknown permission_mode %q (want %s)", permissionMode, strings.Join(PermissionModes, ", "))
		}
		pol.Mode = permissionMode
	}
	for _, t := range allowed {
		if strings.TrimSpace(t) == "" {
			return Policy{}, fmt.Errorf("allowed_tools has an empty entry")
		}
	}
	if p == PresetSpecialist {
		pol.Allowed = unique(allowed)
	} else {
		pol.Allowed = unique(append(slices.Clone(allowed), pol.PresetAllowed...))
	}
	callerDeny := RecursionGuard
	if disallowed != nil {
		callerDeny = *disallowed
	}
	pol.Disallowed = unique(append(slices.Clone(callerDeny), deny...))
	return pol, nil
}

// BuiltinTools returns the names of the CLI's own tools an allowlist
// names, argument patterns reduced to their tool ("Bash(git *)" → "Bash").
func BuiltinTools(allowed []string) []string {
	var out []string
	for _, t := range allowed {
		if IsMCPTool(t) || strings.Contains(t, "/") {
			continue
		}
		name, _, _ := strings.Cut(t, "(")
		out = append(out, strings.TrimSpace(name))
	}
	return unique(out)
}

// IsMCPTool reports whether a tool entry names an MCP tool or server.
func IsMCPTool(t string) bool { return strings.HasPrefix(t, "mcp__") }

func unique(xs []string) []string {
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// Record is the policy as an agent record carries it.
func (p Policy) Record(cwd string) *AgentPolicy {
	return &AgentPolicy{Preset: p.Preset, AllowedTools: nonNil(p.Allowed), DisallowedTools: nonNil(p.Disallowed), Only: p.Only, Mode: p.Mode, CWD: cwd, Ask: p.Ask}
}

func nonNil(xs []string) []string {
	if xs == nil {
		return []string{}
	}
	return xs
}
