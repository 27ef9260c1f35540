package main

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A node carrying team=ml, under a label budget, is SIGKILLed while its
// agent's turn runs; the coordinator closes the turn with the use the
// record last gave it. Its closing result carried the coordinator's own
// name as the producing node, and the ledger and shoal usage counted it
// as a turn of node "coordinator", which carries no labels: the killed
// turn's use was in the fleet's count but never in team=ml's, and shoal
// usage put it under node "coordinator" and label "(none)". The closing
// events name the node they close for (Shoal-Closed-For), and the turn
// counts there.
func TestTurnOfALostNodeCountsInItsLabels(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Text: "Waiting.", Usage: fakemodel.Usage{Input: 5000, Output: 400},
		ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"sleep 60","description":"Wait"}`)}}})
	n := p.node("ml", "--labels", "team=ml")
	p.must("budget", "set", "--label", "team=ml", "--tokens", "1000000")
	id, _ := p.openOn("--node", "ml", "--permission", "bypass")
	p.must("send", id, "Take your time.")
	openLeaseFabric(t, p.url).runningRecorded(id)
	n.stop(syscall.SIGKILL)
	poll.Until(t, 60*time.Second, "the coordinator closes the lost node's agent", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := p.shoal("status", "--json", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusDead
	})
	var fleet, label schemas.BudgetLine
	poll.Until(t, 30*time.Second, "the fleet's count to hold the closed turn", func() bool {
		json.Unmarshal([]byte(p.must("budget", "--fleet", "--json")), &fleet)
		return schemas.TokensOf(fleet.Used) > 0
	})
	json.Unmarshal([]byte(p.must("budget", "--label", "team=ml", "--json")), &label)
	if schemas.TokensOf(label.Used) != schemas.TokensOf(fleet.Used) {
		t.Errorf("the only turn ran on the team=ml node and the fleet's count holds %d tokens of it, label team=ml's %d",
			schemas.TokensOf(fleet.Used), schemas.TokensOf(label.Used))
	}
	for _, by := range []string{"node", "label"} {
		var rep usageReport
		if err := json.Unmarshal([]byte(p.must("usage", "--by", by, "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"node": "ml", "label": "team=ml"}[by]
		for _, row := range rep.Rows {
			if row.Key != want && schemas.TokensOf(row.Usage) > 0 {
				t.Errorf("shoal usage --by %s puts %d tokens of the turn node ml ran under %q", by, schemas.TokensOf(row.Usage), row.Key)
			}
		}
	}
}
