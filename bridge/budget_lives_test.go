package bridge_test

import (
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent's budget covers every life of the id, through the record's
// usage_before. A node forgets the oldest dead agent's record once it
// keeps MaxDead (10 by default) newer dead ones, and a claim over no
// record starts the id's lives afresh: reopened then, a capped agent spent
// its whole budget again, and again after every MaxDead closes on its
// node. The record of an id with a budget of its own is kept.
func TestAgentBudgetCoversEveryLifeAfterItsNodeForgetsIt(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &spender{step: 500, every: 200 * time.Millisecond}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}, MaxDead: 1})
	work := t.TempDir()
	person := fb.client(nil)
	var rep schemas.OpenReply
	open := func(id string, extra map[string]any) {
		t.Helper()
		args := map[string]any{"cwd": work, "id": id, "disallowed_tools": []string{}}
		for k, v := range extra {
			args[k] = v
		}
		ok(t, person, "agent_open", args, &rep)
	}
	closeAgent := func(id string) {
		t.Helper()
		if text, isErr := call(t, person, "agent_close", map[string]any{"agent_id": id}); isErr {
			t.Fatal(text)
		}
	}
	open("worker", map[string]any{"budget_tokens": 1000})
	if text, isErr := call(t, person, "agent_run", map[string]any{"agent_id": "worker", "text": "spend 1500"}); isErr {
		t.Logf("the first life's turn: %s", text)
	}
	rec, err := fb.f.Record(t.Context(), "worker")
	if err != nil || schemas.TokensOf(rec.AllLives()) < 1000 {
		t.Fatalf("the first life used %+v (%v), want its budget's 1,000", rec.Usage, err)
	}
	closeAgent("worker")
	// The promise holds while the record is kept.
	open("worker", nil)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "worker", "text": "spend 1500"}); !isErr {
		t.Fatalf("the second life's turn was not refused while the record was kept: %s", text)
	}
	closeAgent("worker")
	// Two other agents come and go on the node (MaxDead 1 here; 10 by default).
	for _, id := range []string{"other1", "other2"} {
		open(id, nil)
		closeAgent(id)
	}
	// other1, dead before other2, is forgotten with worker: its record,
	// with no budget, goes.
	poll.Until(t, 20*time.Second, "the node to forget its oldest dead agents", func() bool {
		_, err := fb.f.Record(t.Context(), "other1")
		return schemas.CodeOf(err) == schemas.CodeNotFound
	})
	open("worker", nil) // the budget of 1,000 is still set on the id
	text, isErr := call(t, person, "agent_run", map[string]any{"agent_id": "worker", "text": "spend 1500"})
	if !isErr {
		rec, _ := fb.f.Record(t.Context(), "worker")
		t.Errorf("worker, capped at 1,000 tokens for every life and having used them, ran another turn once its record was forgotten (%q): "+
			"this life used %d tokens, usage_before %v", text, schemas.TokensOf(rec.Usage), rec.UsageBefore)
	}
}
