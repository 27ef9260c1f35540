package main

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A living agent on a confined node whose events have all aged out of
// the stream (an agent idle while a busy fleet fills the stream's bytes,
// or past its age) goes on after a coordinator restart: the relay,
// started afresh, found nothing of the agent in the stream and refused
// its next event as not following event 0, and the node dropped it and
// every event after (a turn answered to no one). The node names, with
// each event it sends the relay, the last event of the agent the stream
// acknowledged, which the relay takes for where the numbering stands
// when the stream holds none of the agent's life.
func TestLivingAgentGoesOnAfterItsEventsAgedOutAndTheCoordinatorRestarts(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t))
	p := startAuthPool(t, "coordinator", "ops", "--port", port, "--stream-duplicates", "1s", "--stream-max-age", "3s")
	nc, err := nats.Connect(p.url, nats.UserCredentials(p.creds["ops"]), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	events := func() schemas.EventsReply {
		t.Helper()
		rep, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "living", Max: 5000, IncludeDeltas: true})
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		return rep
	}
	p.fake.Script(fakemodel.Reply{Text: "The first answer."}, fakemodel.Reply{Text: "An answer after the restart."})
	p.must(t, "open", "--id", "living", t.TempDir())
	if out := p.must(t, "run", "living", "First."); out != "The first answer." {
		t.Fatalf("turn 1 answered %q", out)
	}
	seen := events().NextEvent - 1
	poll.Until(t, 30*time.Second, "retention drops the agent's events", func() bool {
		return len(events().Events) == 0
	})

	p.restartUp(t, syscall.SIGKILL)
	poll.Until(t, 30*time.Second, "the node is back", func() bool {
		_, err := nc.Request(schemas.ControlSubject("far", schemas.VerbList), []byte(`{}`), time.Second)
		return err == nil
	})
	if out := p.must(t, "run", "--timeout", "60s", "living", "Again."); out != "An answer after the restart." {
		t.Fatalf("the turn after the restart answered %q", out)
	}
	page := events()
	if len(page.Events) == 0 || page.Events[0].N != seen+1 {
		t.Fatalf("after event %d the stream holds %d events from %+v; want the next turn's from %d", seen, len(page.Events), page.Events[:min(1, len(page.Events))], seen+1)
	}
	for i, e := range page.Events {
		if e.N != seen+1+uint64(i) {
			t.Fatalf("event %d of the turn after the restart is numbered %d", i, e.N)
		}
	}
	last, err := schemas.Decode(page.Events[len(page.Events)-1].Event)
	if err != nil || last.Kind() != schemas.KindResult {
		t.Errorf("the turn after the restart ends with %s (%v)", page.Events[len(page.Events)-1].Event, err)
	}
}
