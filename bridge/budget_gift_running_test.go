package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent under a budget of 10,000 tokens is some 5,000 to 7,000 into a
// turn (its CLI has said so, and its node has written it in the record's
// running) when it opens a child and gives it 9,000. What the parent had
// left was reckoned from its ended turns alone, not its running turn's:
// the gift was granted out of the 3,000 or so left, and the family could
// spend 16,000 or so of 10,000. The running turn's use counts.
func TestGiftIsTakenFromWhatTheRunningTurnLeft(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 200 * time.Millisecond}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "giver", "budget_tokens": 10000, "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "giver", "text": "spend 9500"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 60*time.Second, "the parent's record to say its running turn used 5,000", func() bool {
		rec, err := fb.f.Record(t.Context(), "giver")
		return err == nil && rec.Running != nil && schemas.TokensOf(*rec.Running) >= 5000
	})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "giver"})
	text, refused := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "heir", "budget_tokens": 9000})
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the parent's turn to end", func() bool {
		rec, _ = fb.f.Record(t.Context(), "giver")
		return rec.Status == schemas.StatusIdle && rec.Usage.OutputTokens > 0
	})
	if refused {
		if !strings.Contains(text, "has used") {
			t.Errorf("the gift was refused, not for the budget left: %s", text)
		}
		return
	}
	gift := budgetsOf(t, fb)["heir"].Tokens
	if family := schemas.TokensOf(rec.AllLives()) + gift; family > 12500 {
		t.Errorf("under a budget of 10,000 tokens the parent spent %d and gave its child %d: the family may spend %d", schemas.TokensOf(rec.AllLives()), gift, family)
	}
}
