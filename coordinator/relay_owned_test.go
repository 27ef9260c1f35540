package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// deadRecords writes n dead agent records of about 1 KiB each naming
// node, as a node's agents with budgets of their own leave them, or as
// the monitor leaves those of a node it took for lost.
func deadRecords(t *testing.T, js jetstream.JetStream, node string, n int, id func(int) string) {
	t.Helper()
	ctx := natstest.Context(t, 2*time.Minute)
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	base := float64(time.Now().Add(-24 * time.Hour).Unix())
	for i := range n {
		rec := schemas.AgentRecord{ID: id(i), Node: node, Status: schemas.StatusDead, Model: "sonnet",
			CWD: "/home/dev/src/" + strings.Repeat("p", 700), SessionID: fmt.Sprintf("%036d", i),
			CreatedAt: base + float64(i), LastActivity: base + float64(i), EventLog: id(i) + ".jsonl", Turn: 3, LastEvent: 40}
		b, _ := json.Marshal(rec)
		if _, err := agents.Put(ctx, id(i), b); err != nil {
			t.Fatal(err)
		}
	}
}

// A confined node whose name is on 1,100 dead records of about 1 KiB (its
// agents with budgets of their own keep theirs; the monitor leaves those
// of a node it took for lost) restarts on a fabric of 1 MiB messages. The
// relay answered its question for them with every one in one message,
// which the publish dropped: the node never heard back and never started.
// It now asks a page at a time; a node of an earlier version, which asks
// for all, is answered that they do not fit, not left waiting.
func TestConfinedNodeStartsWithManyRecords(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.MaxPayload = 1 << 20 })
	deadRecords(t, s.F.JetStream(), "n1", 1100, func(i int) string { return fmt.Sprintf("d%05d", i) })

	nc := s.Connect(t, broker.RoleNode, "n1")
	ask := func(body []byte) (*nats.Msg, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		return nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: schemas.RelaySubject("n1", schemas.RelayOwned), Data: body})
	}
	m, err := ask(nil)
	if err != nil {
		t.Errorf("a node of an earlier version asking for all its records: %v", err)
	} else if err := schemas.DecodeReply(m.Data, &schemas.RelayOwnedReply{}); err == nil || !strings.Contains(err.Error(), "more than a message of this fabric holds") {
		t.Errorf("a node of an earlier version asking for all its records was answered: %v", err)
	}
	seen, pages := map[string]bool{}, 0
	for after := ""; ; pages++ {
		body, _ := json.Marshal(schemas.RelayOwnedRequest{Paged: true, After: after})
		m, err := ask(body)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		var rep schemas.RelayOwnedReply
		if err := schemas.DecodeReply(m.Data, &rep); err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(m.Data) > 1<<19+1<<10 {
			t.Errorf("page %d is %d bytes, past half a message", pages, len(m.Data))
		}
		for _, e := range rep.Records {
			var rec schemas.AgentRecord
			if json.Unmarshal(e.Value, &rec) != nil || seen[rec.ID] {
				t.Fatalf("page %d holds %s again, or a record that does not decode", pages, rec.ID)
			}
			seen[rec.ID] = true
		}
		if rep.Next == "" {
			break
		}
		after = rep.Next
	}
	if len(seen) != 1100 || pages < 2 {
		t.Errorf("%d records in %d pages, want 1,100 in more than one", len(seen), pages+1)
	}

	h, err := node.New(node.Config{Name: "n1", Conn: s.Connect(t, broker.RoleNode, "n1"), Dir: t.TempDir(),
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}, Confined: true})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	select {
	case <-h.Ready():
	case err := <-done:
		done <- err
		t.Fatalf("confined node n1 with 1,100 records did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("confined node n1 with 1,100 records did not start within a minute")
	}
}
