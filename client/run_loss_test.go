package client_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A run whose agent's record turns dead says what became of its node as
// the record says it: lost (the coordinator's close names it) or
// restarted (the node closed what it left in its own name); "before the
// turn ended", which it may not have begun. It said "was lost during the
// turn" for a node restarted within its TTL, and for a turn never begun
// (outside chaos test). The record is written dead here as each would
// write it, while the agent's turn runs on.
func TestARunSaysHowItsAgentDied(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{Delay: time.Second})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, js := natstest.JetStream(t, srv)
	agents, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ closedBy, want string }{
		{"", "agent '%s' is dead: its node a restarted before the turn ended"},
		{"coordinator", "agent '%s' is dead: its node a was lost before the turn ended"},
	} {
		op, err := f.Open(t.Context(), schemas.OpenRequest{CWD: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() {
			_, err := f.Run(t.Context(), schemas.RunRequest{AgentID: op.AgentID, Text: "slow" + strings.Repeat(" word", 60)})
			ran <- err
		}()
		var rev uint64
		var rec schemas.AgentRecord
		poll.Until(t, 10*time.Second, "the agent works", func() bool {
			e, err := agents.Get(t.Context(), op.AgentID)
			if err != nil || json.Unmarshal(e.Value(), &rec) != nil {
				return false
			}
			rev = e.Revision()
			return rec.Status == schemas.StatusWorking
		})
		dead := rec.Dead()
		dead.ClosedBy = c.closedBy
		b, _ := json.Marshal(dead)
		if _, err := agents.Update(t.Context(), op.AgentID, b, rev); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-ran:
			if want := strings.Replace(c.want, "%s", op.AgentID, 1); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("the run whose agent was closed by %q: %v; want %q", c.closedBy, err, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the run whose agent's record says dead still waits")
		}
	}
}
