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
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// smallMessages is a fabric whose messages hold at most 64 KiB (a NATS
// server of a user's own holds 1 MiB by default), and an observer of it
// through the fabric service.
func smallMessages(t *testing.T) (*fabrictest.Secured, client.Client) {
	t.Helper()
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.MaxPayload = 64 << 10 })
	observer, err := client.New(s.Connect(t, broker.RoleObserver, "watcher"), client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, observer
}

// madeAgents writes the records of n agents of about 1 KiB each, the
// i-th made i seconds after the first, named id(i).
func madeAgents(t *testing.T, s *fabrictest.Secured, n int, id func(i int) string) {
	t.Helper()
	ctx := natstest.Context(t, time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	base := float64(time.Now().Unix())
	for i := range n {
		rec := schemas.AgentRecord{ID: id(i), Node: "n1", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/w/" + strings.Repeat("d", 900),
			CreatedAt: base + float64(i), LastActivity: base + float64(i), EventLog: id(i) + ".jsonl"}
		b, _ := json.Marshal(rec)
		if _, err := agents.Create(ctx, id(i), b); err != nil {
			t.Fatal(err)
		}
	}
}

// The list of the agents through the fabric service comes in pages, each
// within the fabric's message limit: three hundred records of about 1 KiB
// are listed whole, in the order they were made, where one reply of them
// all would not fit a message.
func TestListThroughTheServiceComesInPages(t *testing.T) {
	t.Parallel()
	s, observer := smallMessages(t)
	ctx := natstest.Context(t, time.Minute)
	const n = 300
	// Made in an order other than their ids'.
	madeAgents(t, s, n, func(i int) string { return fmt.Sprintf("a%03d", (i*7)%n) })
	recs, err := observer.List(ctx)
	if err != nil {
		t.Fatalf("an observer's list of %d agents through the fabric service: %v", n, err)
	}
	if len(recs) != n {
		t.Fatalf("listed %d agents, want %d", len(recs), n)
	}
	for i, r := range recs {
		if want := fmt.Sprintf("a%03d", (i*7)%n); r.ID != want {
			t.Fatalf("agent %d listed is %s, want %s (the order they were made in)", i, r.ID, want)
		}
	}
}

// The nodes come in pages that fit a message: three nodes of 30 KiB each
// (a node's record may be 64 KiB, its model servers' lists in it) in
// messages of 64 KiB, and so do the budgets. They were one reply each,
// and a few dozen real nodes on a NATS server of 1 MiB messages took
// `shoal nodes` from every scoped client. A reply larger than a message
// may be (the budgets asked whole, as a client of an earlier version
// asks) is answered with an error saying so, at once: not left for the
// caller to wait out.
func TestAReplyTooLargeForAMessageIsAnError(t *testing.T) {
	t.Parallel()
	s, observer := smallMessages(t)
	ctx := natstest.Context(t, time.Minute)
	nodes, err := s.F.JetStream().KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		rec := schemas.NodeRecord{Name: name, Version: strings.Repeat("v", 30<<10), Instance: "i", Labels: map[string]string{}, Backends: []schemas.BackendInfo{}, StartedAt: now, Heartbeat: now}
		b, _ := json.Marshal(rec)
		if _, err := nodes.Put(ctx, name, b); err != nil {
			t.Fatal(err)
		}
	}
	for {
		all, _ := s.F.Nodes(ctx)
		if len(all) == 3 || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, err := observer.Nodes(ctx)
	if err != nil || len(got) != 3 || got[0].Name != "n0" || got[2].Name != "n2" {
		t.Errorf("the nodes, 90 KiB of them in messages of 64 KiB: %d of them, %v", len(got), err)
	}

	budgets, err := s.F.JetStream().KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		b, _ := json.Marshal(schemas.Budget{Tokens: 200000, USD: 2.5, GrantedBy: fmt.Sprintf("p%05d", i/4)})
		if _, err := budgets.Put(ctx, fmt.Sprintf("c%05d", i), b); err != nil {
			t.Fatal(err)
		}
	}
	all, err := observer.Budgets(ctx)
	if err != nil || len(all.Budgets) != 500 || all.Budgets[0].AgentID != "c00000" || all.Budgets[499].AgentID != "c00499" {
		t.Errorf("500 budgets in messages of 64 KiB, in pages: %d of them, %v", len(all.Budgets), err)
	}
	// Asked whole, as a client of an earlier version asks.
	nc := s.Connect(t, broker.RoleObserver, "older")
	qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	began := time.Now()
	m, err := nc.RequestWithContext(qctx, schemas.FabricSubject(schemas.VerbBudgets), []byte(`{}`))
	if err == nil {
		err = schemas.DecodeReply(m.Data, &schemas.BudgetsReply{})
	}
	if err == nil || !strings.Contains(err.Error(), "more than a message of this fabric holds") || schemas.CodeOf(err) == schemas.CodeTimeout {
		t.Errorf("500 budgets asked whole in messages of 64 KiB: %v (after %s)", err, time.Since(began).Round(time.Millisecond))
	}
}

// A page of an agent's events through the fabric service is cut at the
// message limit as well as at its count: forty events of 10 KiB come in
// pages that fit 64 KiB messages, each saying there is more, and reading
// on from each page's next event gives them all, once each.
func TestEventsThroughTheServiceComeInPagesThatFit(t *testing.T) {
	t.Parallel()
	s, observer := smallMessages(t)
	ctx := natstest.Context(t, time.Minute)
	js, err := jetstream.New(s.F.Conn())
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := 1; i <= n; i++ {
		env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(fmt.Sprintf("%d %s", i, strings.Repeat("x", 10<<10)))}})
		m := nats.NewMsg(schemas.EventSubject("big"))
		m.Data = env
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("big", uint64(i)))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	from, pages := uint64(0), 0
	for pages = 1; pages < 100; pages++ {
		rep, err := observer.Events(ctx, schemas.EventsRequest{AgentID: "big", FromEvent: from, Max: 1000})
		if err != nil {
			t.Fatalf("page %d of agent big's events from %d: %v", pages, from, err)
		}
		for _, e := range rep.Events {
			got = append(got, e.N)
		}
		if !rep.More {
			break
		}
		from = rep.NextEvent
	}
	if len(got) != n || pages < 7 {
		t.Fatalf("read %d events of %d in %d pages: %v", len(got), n, pages, got)
	}
	for i, e := range got {
		if e != uint64(i+1) {
			t.Fatalf("event %d read is %d: %v", i, e, got)
		}
	}
}

// A client of an earlier version asks for the list with {} and reads
// "agents" only (it knows no "next"): it is answered whole, as before
// paging, so forty records of about 1 KiB, within one 64 KiB message, are
// all listed (cut at half a message, it listed 26 of them with no error).
func TestAnOlderClientIsAnsweredTheWholeList(t *testing.T) {
	t.Parallel()
	s, _ := smallMessages(t)
	ctx := natstest.Context(t, time.Minute)
	const n = 40
	madeAgents(t, s, n, func(i int) string { return fmt.Sprintf("a%03d", i) })
	nc := s.Connect(t, broker.RoleObserver, "older")
	m, err := nc.RequestWithContext(ctx, schemas.FabricSubject(schemas.VerbList), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Data) > 64<<10 {
		t.Fatalf("reply of %d bytes", len(m.Data))
	}
	var old struct {
		Agents []schemas.AgentRecord `json:"agents"`
	}
	if err := json.Unmarshal(m.Data, &old); err != nil {
		t.Fatal(err)
	}
	if len(old.Agents) != n {
		t.Errorf("an older client's list of %d agents (about %d KiB, within a 64 KiB message) shows %d, with no error", n, n, len(old.Agents))
	}
}

// Strays on an agent's subject do not make a page of its events too large
// for a message: they are named while they take a quarter of one and
// counted beyond (1,500 of them were listed whole, and the agent could not
// be read through the fabric service at all, whatever max was).
func TestStraysDoNotMakeAnEventsPageTooLarge(t *testing.T) {
	t.Parallel()
	s, observer := smallMessages(t)
	ctx := natstest.Context(t, time.Minute)
	js, err := jetstream.New(s.F.Conn())
	if err != nil {
		t.Fatal(err)
	}
	for range 1500 { // anything published on agent.<id> is stored
		if _, err := js.Publish(ctx, schemas.EventSubject("strayed"), []byte("not an event")); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 2; i++ {
		env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hello")}})
		m := nats.NewMsg(schemas.EventSubject("strayed"))
		m.Data = env
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("strayed", i))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := observer.Events(ctx, schemas.EventsRequest{AgentID: "strayed", Max: 1})
	if err != nil {
		t.Fatalf("a page of one event of an agent with 1500 strays: %v", err)
	}
	if len(rep.Events) != 1 || len(rep.Foreign) == 0 || len(rep.Foreign)+rep.ForeignOmitted != 1500 {
		t.Errorf("read %d events, %d strays named and %d counted, want 1 and 1,500 in all", len(rep.Events), len(rep.Foreign), rep.ForeignOmitted)
	}
}
