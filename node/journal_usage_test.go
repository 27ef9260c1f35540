package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A turn that ended while the coordinator was away, its events kept in
// the node's journal, the node then killed: the restarted node stores the
// events, the turn's result among them, and closes the agent; but the
// agent's record kept the usage of the turns before it, so a budget over
// every life of the id (which reads the record) missed the turn, and a
// reopen ran a turn past it (outside review). The record the restarted
// node closes counts the journal's results.
func TestAJournaledTurnCountsInTheRecord(t *testing.T) {
	t.Parallel()
	store, dir := t.TempDir(), t.TempDir()
	port := freePort(t)
	b := runBrokerProcess(t, store, port)
	proc, f := startAgentProcess(t, b.url, dir, "slow")
	open := proc.open
	if _, err := f.Run(t.Context(), schemas.RunRequest{AgentID: open.AgentID, Text: "one"}); err != nil {
		t.Fatal(err)
	}
	// A turn of about 2 s, the coordinator gone a moment after it began.
	if _, err := f.Send(t.Context(), schemas.SendRequest{AgentID: open.AgentID, Text: "two" + strings.Repeat(" word", 20)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	b.kill()
	time.Sleep(5 * time.Second) // the turn ends, its events in the journal
	proc.node.Process.Kill()
	<-proc.exited

	b = runBrokerProcess(t, store, port)
	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: dir, url: b.url})
	w := g.watch(open.AgentID)
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	results := 0
	for _, e := range w.events() {
		if _, ok := e.Payload.(schemas.Result); ok {
			results++
		}
	}
	if results != 2 {
		t.Fatalf("the stream holds %d results; want both turns'", results)
	}
	poll.Until(t, 10*time.Second, "the agent's record says dead", func() bool {
		r, err := g.fabric.Record(t.Context(), open.AgentID)
		return err == nil && r.Status == schemas.StatusDead
	})
	rec, err := g.fabric.Record(t.Context(), open.AgentID)
	if err != nil {
		t.Fatal(err)
	}
	if u := rec.AllLives(); u.InputTokens != 20 || u.OutputTokens != 6 {
		t.Errorf("the record counts %d in, %d out; want both turns' 20 and 6 (%s)", u.InputTokens, u.OutputTokens, mustJSON(rec))
	}
}
