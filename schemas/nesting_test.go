package schemas_test

import (
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// A child never exceeds its parent: preset, mode, allowlist, denials and
// directory.
func TestAdmits(t *testing.T) {
	none := []string{}
	compose := func(preset, mode string, allowed []string, deny *[]string, only bool) schemas.Policy {
		t.Helper()
		p, err := schemas.ComposePolicy(preset, mode, allowed, deny, only)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	parent := func(p schemas.Policy) schemas.AgentPolicy { return *p.Record("/w/p") }
	notebook := parent(compose("notebook", "", nil, &none, false))
	lab := parent(compose("lab", "", nil, &none, false))
	spec := parent(compose("specialist", "", []string{"Read", "mcp__shoal__agent_output", "mcp__files"}, &none, false))
	guarded := parent(compose("default", "", nil, nil, false))
	for _, c := range []struct {
		name   string
		parent schemas.AgentPolicy
		child  schemas.Policy
		cwd    string
		want   string // "" admits
	}{
		{"the same preset, inside", notebook, compose("notebook", "", nil, &none, false), "/w/p/sub", ""},
		{"its own directory", notebook, compose("notebook", "", nil, &none, false), "/w/p", ""},
		{"bypass under notebook", notebook, compose("bypass", "", nil, &none, false), "/w/p", "preset bypass is wider than this agent's (notebook)"},
		{"default under notebook", notebook, compose("default", "", nil, &none, false), "/w/p", "preset default is wider"},
		{"a wider mode", notebook, compose("notebook", "bypassPermissions", nil, &none, false), "/w/p", "permission mode bypassPermissions is wider"},
		{"the parent's denials dropped", parent(compose("notebook", "", nil, &[]string{"WebFetch"}, false)), compose("notebook", "", nil, &none, false), "/w/p", "may not call WebFetch, so its child may not either"},
		{"a specialist under notebook", notebook, compose("specialist", "", []string{"mcp__shoal__agent_output"}, &none, false), "/w/p", ""},
		{"outside", notebook, compose("notebook", "", nil, &none, false), "/w/other", "/w/other is outside this agent's workspace /w/p"},
		{"a sibling by prefix", notebook, compose("notebook", "", nil, &none, false), "/w/p2", "outside"},
		{"lab under lab", lab, compose("lab", "", nil, &none, false), "/w/p", ""},
		{"auto under lab: as wide, another kind", lab, compose("auto", "", nil, &none, false), "/w/p", "preset auto is wider"},
		{"narrower under lab", lab, compose("notebook", "", nil, &none, false), "/w/p", ""},
		{"specialist, a subset", spec, compose("specialist", "", []string{"Read", "mcp__files__lookup"}, &none, false), "/w/p", ""},
		// The claude CLI matches its flags' tool names in their case: a
		// parent's "bash" denies or allows it nothing.
		{"the parent's denial in another case", parent(compose("default", "", nil, &[]string{"Bash"}, false)), compose("default", "", nil, &[]string{"bash"}, false), "/w/p", "may not call Bash, so its child may not either"},
		{"an allowlist entry in another case", parent(compose("default", "", []string{"bash"}, &none, false)), compose("default", "", []string{"Bash"}, &none, false), "/w/p", "allowed tool Bash is not in this agent's allowlist"},
		{"a specialist's entry in another case", spec, compose("specialist", "", []string{"read"}, &none, false), "/w/p", "allowed tool read is not in this agent's allowlist"},
		{"only, a subset", spec, compose("specialist", "", []string{"Read"}, &none, true), "/w/p", ""},
		{"specialist, a tool beyond", spec, compose("specialist", "", []string{"Read", "WebFetch"}, &none, false), "/w/p", "allowed tool WebFetch is not in this agent's allowlist"},
		{"specialist parent, unbounded child", spec, compose("notebook", "", nil, &none, false), "/w/p", "preset notebook is wider"},
		{"an allowlist beyond a default parent's", parent(compose("default", "", nil, &none, false)), compose("default", "", []string{"Bash"}, &none, false), "/w/p", "allowed tool Bash is not in this agent's allowlist"},
		{"a wider pattern than the parent's", parent(compose("default", "", []string{"Bash(git *)"}, &none, false)), compose("default", "", []string{"Bash"}, &none, false), "/w/p", "allowed tool Bash is not in this agent's allowlist"},
		{"the parent's pattern", parent(compose("default", "", []string{"Bash(git *)", "Read"}, &none, false)), compose("default", "", []string{"Bash(git *)"}, &none, false), "/w/p", ""},
		{"the parent's own preset allowance", notebook, compose("notebook", "", []string{"mcp__shoal__agent_list"}, &none, false), "/w/p", ""},
		{"anything under bypass", parent(compose("bypass", "", nil, &none, false)), compose("default", "", []string{"Bash", "WebFetch"}, &none, false), "/w/p", ""},
		{"the guard kept", guarded, compose("default", "", nil, nil, false), "/w/p", ""},
		{"the guard lifted", guarded, compose("default", "", nil, &none, false), "/w/p", "may not call mcp__shoal__agent_open"},
	} {
		err := c.parent.Admits(c.child, c.cwd)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

// An agent's allowlist approves a descendant's request in the names'
// case between two claude agents, and in any case where either is judged
// by Shoal: a parent allowed Bash was refused approving its opencode
// child's bash, the very tool its own allowlist names.
func TestApprovesInTheCaseOfItsJudge(t *testing.T) {
	parent := schemas.AgentPolicy{Preset: schemas.PresetDefault, AllowedTools: []string{"Bash"}}
	if err := parent.Approves("bash", true); err != nil {
		t.Errorf("a parent allowed Bash approving an ACP child's bash: %v", err)
	}
	if err := parent.Approves("bash", false); err == nil {
		t.Errorf("a claude parent allowed Bash approved a claude child's bash, a tool its CLI would not match")
	}
	lower := schemas.AgentPolicy{Preset: schemas.PresetDefault, AllowedTools: []string{"bash"}}
	if err := lower.Approves("Bash", false); err == nil {
		t.Errorf("a claude parent whose allowlist says bash (no tool of its CLI's) approved a claude child's Bash")
	}
	if err := parent.Approves("Bash", false); err != nil {
		t.Errorf("a claude parent allowed Bash approving a claude child's Bash: %v", err)
	}
}
