package schemas

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultMaxDepth is how deep agents may open agents when the coordinator
// is not told otherwise: an agent's child is at depth 1, its grandchild at
// 2.
const DefaultMaxDepth = 2

// presetWidth orders the presets by what they let an agent do; a child
// may take its parent's preset or a narrower one.
var presetWidth = map[Preset]int{
	PresetSpecialist: 0, // its allowlist and nothing else
	PresetNotebook:   1, // Shoal's tools, no files or shell of its own
	PresetDefault:    2, // edits, shell when the CLI asks
	PresetAuto:       3, // a classifier approves what it judges safe
	PresetLab:        3, // Shoal's tools and the ACP agent's file access
	PresetBypass:     4, // no checks
}

// modeWidth orders the claude CLI's permission modes the same way.
var modeWidth = map[string]int{"plan": 0, "default": 1, "acceptEdits": 2, "auto": 3, "bypassPermissions": 4}

// Admits says why an agent whose policy is p may not open an agent with
// policy child in directory cwd, or returns nil. A child never exceeds
// its parent: its preset and permission mode are no wider; its allowlist
// names nothing the parent's does not (unless the parent skips every
// check); when the parent's allowlist is its whole tool set (only,
// specialist), the child's is too; everything the parent
// is denied, the child is denied; and its directory is the parent's or
// inside it. Paths are compared as given: resolve symlinks first.
func (p AgentPolicy) Admits(child Policy, cwd string) error {
	if presetWidth[child.Preset] > presetWidth[p.Preset] || (presetWidth[child.Preset] == presetWidth[p.Preset] && child.Preset != p.Preset) {
		return fmt.Errorf("preset %s is wider than this agent's (%s)", child.Preset, p.Preset)
	}
	if p.Mode != "" && modeWidth[child.Mode] > modeWidth[p.Mode] {
		return fmt.Errorf("permission mode %s is wider than this agent's (%s)", child.Mode, p.Mode)
	}
	if child.Dangerous && p.Preset != PresetBypass {
		return fmt.Errorf("skipping permission checks is wider than this agent's %s", p.Preset)
	}
	if p.Only || p.Preset == PresetSpecialist {
		if !child.Only && child.Preset != PresetSpecialist {
			return fmt.Errorf("this agent's tools are exactly its allowlist, so a child's must be too (only, or the specialist preset)")
		}
		for _, t := range child.Allowed {
			if !slices.ContainsFunc(p.AllowedTools, func(e string) bool { return covers(e, t) }) {
				return fmt.Errorf("allowed tool %s is not in this agent's allowlist", t)
			}
		}
	}
	if p.Preset != PresetBypass {
		// An allowlist pre-approves: a child's may name only what its
		// parent's does, or the child would run without asking what its
		// parent must ask for (or may not run at all).
		for _, t := range child.CallerAllowed {
			if !slices.ContainsFunc(p.AllowedTools, func(e string) bool { return covers(e, t) }) {
				return fmt.Errorf("allowed tool %s is not in this agent's allowlist, and a child's allowlist approves only what its parent's does", t)
			}
		}
	}
	for _, d := range p.DisallowedTools {
		if !slices.ContainsFunc(child.Disallowed, func(e string) bool { return strings.TrimSpace(e) == strings.TrimSpace(d) }) {
			return fmt.Errorf("this agent may not call %s, so its child may not either: keep it in disallowed_tools", d)
		}
	}
	if !Within(p.CWD, cwd) {
		return fmt.Errorf("%s is outside this agent's workspace %s", cwd, p.CWD)
	}
	return nil
}

// Approves says why an agent whose policy is p may not allow a call of
// tool that one of its descendants asks a person about, or returns nil:
// an agent approves only what its own allowlist approves (unless it
// skips every check), or a child opened with ask would run, on its
// parent's word, what the parent itself must ask a person for or may
// not run at all. Denying is always its to do. anyCase says names match
// in any case: where the agent or the one asking is judged by Shoal (an
// ACP agent, a local model), which matches tools so; between two claude
// agents, whose CLIs match names exactly, they match in their case.
func (p AgentPolicy) Approves(tool string, anyCase bool) error {
	if anyCase {
		tool = strings.ToLower(tool)
	}
	if p.Preset == PresetBypass || slices.ContainsFunc(p.AllowedTools, func(e string) bool {
		if anyCase {
			e = strings.ToLower(e)
		}
		return covers(e, tool)
	}) {
		return nil
	}
	return fmt.Errorf("%s is not in this agent's allowlist, and an agent allows for its descendants only what its own allowlist does: deny, or leave it to a person", tool)
}

// covers reports whether allowlist entry e permits everything entry t
// does: the same entry, a server prefix over its tools, a prefix pattern,
// or a tool over its argument patterns ("Bash" over "Bash(git *)").
//
// Names are compared in their case, here and for the denials a child
// keeps: Shoal's own judges (the door, ACP agents, local models) match
// tools in any case, but the claude CLI matches its flags' names exactly,
// so a parent's "bash" allows or denies it nothing, and a child's "Bash"
// under it would be wider than its parent.
func covers(e, t string) bool {
	e, t = strings.TrimSpace(e), strings.TrimSpace(t)
	switch {
	case e == t:
		return true
	case IsMCPTool(e) && strings.Count(e, "__") == 1 && strings.HasPrefix(t, e+"__"):
		return true
	case strings.HasSuffix(e, "*") && strings.HasPrefix(t, strings.TrimSuffix(e, "*")):
		return true
	}
	name, _, pattern := strings.Cut(t, "(")
	return pattern && strings.TrimSpace(name) == e
}

// Within reports whether path lies inside root, or is root, component-wise:
// both absolute, compared as given.
func Within(root, path string) bool {
	if root == "" || !filepath.IsAbs(path) {
		return false
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
