package schemas

import "testing"

// The door, ACP agents and local models judge a tool by one matcher, so
// they agree on every entry form Kaimon documents: each of these deny
// entries refuses Shoal's agent_open in all three, and none refuses
// agent_status but the server-wide and guarded ones that name it too.
func TestEveryRuleAgreesOnEveryEntryForm(t *testing.T) {
	cases := []struct {
		entry              string
		open, status, bash bool // whether the entry names mcp__shoal__agent_open, mcp__shoal__agent_status, Bash
	}{
		{"agent_open", true, false, false},
		{"AGENT_OPEN", true, false, false},
		{"mcp__shoal__agent_open", true, false, false},
		{"shoal_agent_open", true, false, false}, // opencode's spelling
		{"mcp__shoal", true, true, false},
		{"agent_*", true, true, false},
		{"mcp__shoal__agent_*", true, true, false},
		{"mcp__shoal__agent_o*", true, false, false},
		{"mcp__other__agent_open", false, false, false},
		{"mcp__other", false, false, false},
		{"Agent", false, false, false}, // the CLI's sub-agent tool, not Shoal's
		{"Bash", false, false, true},
		{"Bash(rm *)", false, false, true}, // a deny pattern denies the tool
		{"bash", false, false, true},
		{"mcp__shoal__bash", false, false, true}, // qualified: that server's, or the agent's own
	}
	for _, c := range cases {
		for _, target := range []struct {
			tool ToolName
			want bool
		}{{ShoalTool("agent_open"), c.open}, {ShoalTool("agent_status"), c.status}, {ParseToolName("Bash"), c.bash}} {
			pol := Policy{Preset: PresetDefault, Disallowed: []string{c.entry}}
			door, _ := AgentPolicy{Preset: PresetDefault, DisallowedTools: []string{c.entry}}.Policy().Decide(target.tool, MCPRules)
			acp, _ := pol.Decide(target.tool, ACPRules)
			local, _ := pol.Decide(target.tool, MCPRules)
			if door != !target.want || acp != !target.want || local != !target.want {
				t.Errorf("deny %q, tool %+v: door allows %v, ACP %v, local %v; want %v", c.entry, target.tool, door, acp, local, !target.want)
			}
		}
	}
	// Under only, the allowlist is the whole tool set for the door and
	// local models; ACP's caller allowlist is the agent's world.
	for _, entry := range []string{"agent_status", "mcp__shoal__agent_status", "agent_s*", "mcp__shoal"} {
		pol := Policy{Preset: PresetDefault, Allowed: []string{entry}, CallerAllowed: []string{entry}, Only: true}
		for _, rules := range []Rules{MCPRules, ACPRules} {
			if ok, why := pol.Decide(ShoalTool("agent_status"), rules); !ok {
				t.Errorf("only %q under %v refused agent_status: %s", entry, rules, why)
			}
		}
	}
	pol := Policy{Preset: PresetDefault, Allowed: []string{"agent_status"}, CallerAllowed: []string{"agent_status"}, Only: true}
	for _, rules := range []Rules{MCPRules, ACPRules} {
		if ok, _ := pol.Decide(ShoalTool("agent_open"), rules); ok {
			t.Errorf("only agent_status under %v allowed agent_open", rules)
		}
	}
}
