package node_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/schemas"
)

// A node with MaxAgents 2 that gets many opens at once starts exactly two
// agents: the limit is checked and the slot taken in one step, so the
// opens racing each other cannot all see room. The others are told the
// node is full, and a slot freed by a close can be taken again.
func TestMaxAgentsHoldsUnderConcurrentOpens(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(c *node.Config) { c.MaxAgents = 2 }})
	const racers = 16
	cwd := t.TempDir()
	conns := make([]*nats.Conn, racers)
	for i := range conns {
		conns[i] = natstest.Connect(t, f.b)
	}
	type outcome struct {
		id  string
		err error
	}
	start := make(chan struct{})
	results := make(chan outcome, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			req := mustJSON(schemas.OpenRequest{CWD: cwd, ID: fmt.Sprintf("racer-%02d", i)})
			<-start
			msg, err := conns[i].Request(schemas.ControlSubject("n1", schemas.VerbOpen), []byte(req), 60*time.Second)
			if err != nil {
				results <- outcome{err: fmt.Errorf("request: %w", err)}
				return
			}
			var rep schemas.OpenReply
			err = schemas.DecodeReply(msg.Data, &rep)
			results <- outcome{rep.AgentID, err}
		})
	}
	close(start)
	wg.Wait()
	close(results)
	var opened []string
	for r := range results {
		switch {
		case r.err == nil:
			opened = append(opened, r.id)
		case r.err.Error() != "node n1 is full (2 of 2 agents)" || schemas.CodeOf(r.err) != schemas.CodeUnavailable:
			t.Errorf("a refused open: %v (%s)", r.err, schemas.CodeOf(r.err))
		}
	}
	if len(opened) != 2 {
		t.Fatalf("%d of %d concurrent opens succeeded on a node limited to 2: %v", len(opened), racers, opened)
	}
	live := 0
	for _, r := range nodeList(t, f) {
		if r.Status != schemas.StatusDead {
			live++
		}
	}
	if live != 2 {
		t.Errorf("the node runs %d agents, limit 2", live)
	}
	// A close frees a slot; the next open takes it, and the one after is refused.
	if rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: opened[0]}); err != nil || !rep.Closed {
		t.Fatalf("close: %+v %v", rep, err)
	}
	var rep schemas.OpenReply
	if err := f.ask(schemas.VerbOpen, schemas.OpenRequest{CWD: cwd}, &rep); err != nil {
		t.Fatalf("an open after a close: %v", err)
	}
	if err := f.ask(schemas.VerbOpen, schemas.OpenRequest{CWD: cwd}, &rep); err == nil || schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Errorf("an open past the limit: %+v %v", rep, err)
	}
}
