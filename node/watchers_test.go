package node_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A watcher of agent.* on core NATS, as `nats sub 'agent.*'`, sees only
// events, however the node's batches end: the commits that store nothing
// go to a subject of their own, and nothing is stored there.
func TestWatchersOfAgentSubjectsSeeOnlyEvents(t *testing.T) {
	t.Parallel()
	g := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	nc := natstest.Connect(t, g.b)
	seen := make(chan *nats.Msg, 1<<12)
	sub, err := nc.ChanSubscribe(schemas.EventSubjects, seen)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	id := g.open(schemas.OpenRequest{})
	for i := range 3 {
		// Each turn ends a batch once nothing more is ready.
		if _, err := g.fabric.Run(g.ctx(30*time.Second), schemas.RunRequest{AgentID: id, Text: fmt.Sprintf("turn %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := g.js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(t.Context(), schemas.EventSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	_, n, _ := schemas.ParseMsgID(last.Header.Get(schemas.HeaderMsgID))
	for got := uint64(0); got < n; {
		select {
		case m := <-seen:
			if _, k, err := schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID)); err != nil || k != got+1 {
				t.Fatalf("a watcher of %s saw %q (headers %v) after event %d", schemas.EventSubjects, m.Data, m.Header, got)
			}
			if _, err := schemas.Decode(m.Data); err != nil {
				t.Fatalf("a watcher saw %q, no event: %v", m.Data, err)
			}
			got++
		case <-time.After(10 * time.Second):
			t.Fatalf("the watcher saw %d of the agent's %d events", got, n)
		}
	}
	select {
	case m := <-seen:
		t.Fatalf("the watcher saw %q after the agent's last event", m.Data)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := stream.GetLastMsgForSubject(t.Context(), schemas.BatchEndSubject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("something is stored under %s: %v", schemas.BatchEndSubject, err)
	}
}
