package acp_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/schemas"
)

// costAgent is an ACP agent (claude-agent-acp as its transcript has it:
// a usage_update with the session's cost after each model message of a
// turn) that dies in the middle of its first turn, after reporting that
// the turn has cost $0.25 so far.
const costAgent = `import json, sys, time
def say(v):
    sys.stdout.write(json.dumps(v) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    try:
        req = json.loads(line)
    except Exception:
        continue
    m = req.get("method")
    if m == "initialize":
        say({"jsonrpc": "2.0", "id": req["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif m == "session/new":
        say({"jsonrpc": "2.0", "id": req["id"], "result": {"sessionId": "s1"}})
    elif m == "session/prompt":
        upd = lambda u: say({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": u}})
        upd({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "step one done"}})
        upd({"sessionUpdate": "usage_update", "used": 5000, "size": 200000, "cost": {"amount": 0.25, "currency": "USD"}})
        time.sleep(0.3)
        sys.stderr.write("fatal: out of memory\n")
        sys.exit(3)
    elif "id" in req:
        say({"jsonrpc": "2.0", "id": req["id"], "error": {"code": -32601, "message": "no"}})
`

// spendRecorder is the recorder that also hears what the backend says a
// running turn has used so far (backend.Spender), as the node does.
type spendRecorder struct {
	*recorder
	mu    sync.Mutex
	spent []schemas.Usage
}

func (s *spendRecorder) Spending(u schemas.Usage) {
	s.mu.Lock()
	s.spent = append(s.spent, u)
	s.mu.Unlock()
}

// The README (budgets): "A turn whose CLI dies before its result ends
// cancelled with the use the CLI reported so far, counted as any
// result's." The node counts, for a dead CLI's turn, what its backend
// passed to Spending; the ACP backend passes nothing, and ends no turn
// itself when the agent dies, so the $0.25 claude-agent-acp reported for
// the turn in usage_update goes into no result, no record, no ledger and
// no dollar budget: an ACP agent that dies mid-turn (OOM, a crash, the
// node's stop ladder after an ignored cancel) spends under a dollar
// budget without it counting, again in each life.
func TestACPTurnWhoseAgentDiesKeepsTheCostItReported(t *testing.T) {
	t.Parallel()
	script := filepath.Join(t.TempDir(), "agent.py")
	if err := os.WriteFile(script, []byte(costAgent), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, _ := schemas.ComposePolicy("bypass", "", nil, nil, false)
	b := acp.New(acp.Config{Commands: map[string][]string{acp.AgentClaude: {"python3", script}},
		Env: []string{"PATH=" + os.Getenv("PATH")}, StopWait: 500 * time.Millisecond})
	t.Cleanup(func() { b.Close() })
	rec := &spendRecorder{recorder: newRecorder(t)}
	sess, err := b.Start(t.Context(), backend.Spec{AgentID: "f1", CWD: t.TempDir(), Model: acp.AgentClaude, Policy: pol, Dir: t.TempDir()}, rec)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { sess.Close(t.Context()) })
	if _, err := rec.send(sess, "go"); err != nil {
		t.Fatal(err)
	}
	evs := rec.waitFor(0, "status dead", func(ev schemas.Event) bool {
		st, ok := ev.Payload.(schemas.Status)
		return ok && st.Status == schemas.StatusDead
	})
	counted := false
	for _, ev := range evs {
		if r, ok := ev.Payload.(schemas.Result); ok && r.Usage != nil && r.Usage.CostUSD != nil && *r.Usage.CostUSD >= 0.25 {
			counted = true
		}
	}
	rec.mu.Lock()
	for _, u := range rec.spent {
		if u.CostUSD != nil && *u.CostUSD >= 0.25 {
			counted = true
		}
	}
	spent := len(rec.spent)
	rec.mu.Unlock()
	if !counted {
		t.Errorf("the agent reported its turn cost $0.25, then died: the backend told the node nothing of it (%d Spending calls, no result with a cost), so the cancelled result the node publishes carries no cost; events: %s", spent, summary(evs))
	}
}
