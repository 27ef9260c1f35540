package coordinator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent reopened on node b while the relay's view of it lags: the
// view still says node a owns it and its life ended. Node a's event
// numbered as the agent's next is refused, not stored as the first event
// of b's life (the bucket read that finds the new life finds its new
// owner too), and b's is stored; a bucket read older than what the view
// holds changes nothing in it.
func TestRelayRefusesTheOldOwnerWhileItsViewLags(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	r, err := NewRelay(RelayConfig{Conn: natstest.Connect(t, b)})
	if err != nil {
		t.Fatal(err)
	}
	run, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(run) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	ctx := natstest.Context(t, time.Minute)
	select {
	case <-r.Ready():
	case <-ctx.Done():
		t.Fatal("the relay is not ready")
	}
	_, js := natstest.JetStream(t, b)
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(rec schemas.AgentRecord) uint64 {
		t.Helper()
		v, _ := json.Marshal(rec)
		rev, err := agents.Put(ctx, "roam", v)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	event := func(node string, n uint64, p schemas.Payload) *nats.Msg {
		m := nats.NewMsg(schemas.EventSubject("roam"))
		m.Data, _ = schemas.Encode(schemas.Event{Turn: 1, Payload: p})
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("roam", n))
		m.Header.Set(schemas.HeaderNode, node)
		return m
	}
	text := schemas.AssistantText{Content: schemas.Text("text")}

	// Node a's life: four events, the last its death.
	life := schemas.AgentRecord{ID: "roam", Node: "a", Status: schemas.StatusDead, Model: "sonnet", CWD: "/tmp", RequestID: "r1"}
	ended := put(life)
	for n := uint64(1); n <= 4; n++ {
		var p schemas.Payload = text
		if n == 4 {
			p = schemas.Status{Status: schemas.StatusDead}
		}
		if _, err := js.PublishMsg(ctx, event("a", n, p)); err != nil {
			t.Fatal(err)
		}
	}
	// Reopened on node b; once the watch has it, the view is set back to
	// what it held before, as a view that lags.
	reopened := life
	reopened.Node, reopened.Status, reopened.RequestID = "b", schemas.StatusStarting, "r2"
	put(reopened)
	for {
		r.mu.Lock()
		owner := r.owners["roam"]
		r.mu.Unlock()
		if owner == "b" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the relay's watch never saw the reopen")
		case <-time.After(10 * time.Millisecond):
		}
	}
	r.mu.Lock()
	r.learn("roam", life, ended) // older than what the view holds: nothing changes
	if r.owners["roam"] != "b" || r.statuses["roam"] != schemas.StatusStarting {
		t.Errorf("an older record changed the view: owner %s, status %s", r.owners["roam"], r.statuses["roam"])
	}
	r.owners["roam"], r.statuses["roam"], r.revs["roam"] = "a", schemas.StatusDead, ended
	r.mu.Unlock()

	send := func(node string) (*jetstream.PubAck, error) {
		t.Helper()
		nc := natstest.Connect(t, b, nats.CustomInboxPrefix(schemas.InboxPrefix("node", node)))
		// Its hello opens its door at the relay.
		if _, err := nc.Request(schemas.RelaySubject(node, schemas.RelayHello), nil, 10*time.Second); err != nil {
			t.Fatalf("node %s's hello: %v", node, err)
		}
		m := event(node, 5, text)
		m.Subject = schemas.RelaySubject(node, schemas.RelayEvent, "roam")
		rep, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("node %s's event 5: %v", node, err)
		}
		var ack struct {
			jetstream.PubAck
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(rep.Data, &ack); err != nil {
			t.Fatalf("node %s's event 5 answered %s", node, rep.Data)
		}
		if ack.Error != nil {
			return nil, ack.Error
		}
		return &ack.PubAck, nil
	}
	if ack, err := send("a"); err == nil || !strings.Contains(err.Error(), "node a may not store events of agent roam") {
		t.Fatalf("node a's event numbered as the reopened agent's next: %+v %v, want it refused as not its agent's", ack, err)
	}
	if ack, err := send("b"); err != nil || ack.Duplicate {
		t.Fatalf("node b's first event of the new life: %+v %v", ack, err)
	}
	st, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, schemas.EventSubject("roam"))
	if err != nil || m.Header.Get(schemas.HeaderNode) != "b" || m.Header.Get(schemas.HeaderMsgID) != schemas.MsgID("roam", 5) {
		t.Fatalf("the last event of agent roam: %+v %v, want node b's event 5", m, err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 5 {
		t.Fatalf("the stream holds %+v (%v), want 5 events", info.State, err)
	}
}
