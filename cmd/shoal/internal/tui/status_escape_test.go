package tui

import (
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// The status line shows an agent's reason not to switch models (an ACP
// agent's own error message, relayed by its node) as it came: its escape
// sequences reach the terminal. Every other surface cleans it.
func TestStatusLineShowsNoEscapesOfAnAgentsReason(t *testing.T) {
	m, src := newTestModel(t, schemas.AgentRecord{ID: "w", Node: "n1", Status: schemas.StatusIdle, Model: "acp:opencode", CWD: "/w"})
	src.setModel = schemas.SetModelReply{Reason: "nope \x1b]52;c;cHduZWQ=\x07\x1b]0;TITLEPWN\x07\x1b[2J\x1b[H FORGED\r"}
	key(m, "m")
	key(m, "ctrl+u")
	typeText(m, "acp:opencode:x/y")
	press(m, "enter")
	v := m.View().Content
	for _, bad := range []string{"\x1b]52", "\x1b]0;", "\x1b[2J", "\r"} {
		if strings.Contains(v, bad) {
			t.Errorf("the screen carries %q of what the agent said:\n%q", bad, v[strings.Index(v, "nope"):])
		}
	}
}
