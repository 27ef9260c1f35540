package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// --disallow adds to the recursion guard; only --allow-nested lifts it.
// Before, any list given to --disallow replaced the guard (as a
// disallowed_tools list does over MCP, Kaimon's way), so a person denying
// one more tool let the agent open and drive agents.
func TestDisallowKeepsTheRecursionGuard(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	guard := schemas.MCPToolPrefix + "agent_open"
	for _, tc := range []struct {
		name     string
		args     []string
		guarded  bool
		wantBash bool
	}{
		{"default", nil, true, false},
		{"one more tool", []string{"--disallow", "Bash"}, true, true},
		{"nested allowed, one tool denied", []string{"--allow-nested", "--disallow", "Bash"}, false, true},
		{"nested allowed", []string{"--allow-nested"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := c.must(append(append([]string{"open"}, tc.args...), t.TempDir())...)
			var rec schemas.AgentRecord
			if err := json.Unmarshal([]byte(c.must("status", "--json", id)), &rec); err != nil || rec.Policy == nil {
				t.Fatalf("the record of agent %s: %v", id, err)
			}
			d := rec.Policy.DisallowedTools
			if slices.Contains(d, guard) != tc.guarded || slices.Contains(d, "Bash") != tc.wantBash {
				t.Errorf("open %v: disallowed %v; want the guard %v, Bash %v", tc.args, d, tc.guarded, tc.wantBash)
			}
		})
	}
}
