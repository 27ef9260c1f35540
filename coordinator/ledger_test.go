package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// ledgerRig is a server with the fabric's streams and buckets, and what
// publishes agents' events to it as nodes do.
type ledgerRig struct {
	t   *testing.T
	srv *broker.Broker
	nc  *nats.Conn
	js  jetstream.JetStream
	n   map[string]uint64 // each agent's last event number
	sum schemas.Usage     // every result's usage published
}

func newLedgerRig(t *testing.T) *ledgerRig {
	srv := natstest.Start(t)
	nc, js := natstest.JetStream(t, srv)
	return &ledgerRig{t: t, srv: srv, nc: nc, js: js, n: map[string]uint64{}}
}

// event publishes one of agent's events as node produced it.
func (r *ledgerRig) event(agent, node string, p schemas.Payload) {
	r.t.Helper()
	r.n[agent]++
	b, err := json.Marshal(schemas.Event{Turn: 1, Payload: p})
	if err != nil {
		r.t.Fatal(err)
	}
	m := nats.NewMsg(schemas.EventSubject(agent))
	m.Data = b
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(agent, r.n[agent]))
	m.Header.Set(schemas.HeaderNode, node)
	if _, err := r.js.PublishMsg(r.t.Context(), m); err != nil {
		r.t.Fatal(err)
	}
	if res, ok := p.(schemas.Result); ok && res.Usage != nil {
		r.sum.Add(*res.Usage)
	}
}

// turn publishes a turn of agent on node that used in input and out
// output tokens: a delta, then its result.
func (r *ledgerRig) turn(agent, node string, in, out int64) {
	r.event(agent, node, schemas.AssistantText{Delta: true, Content: schemas.Text("x")})
	r.event(agent, node, schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: in, OutputTokens: out, CostUSD: schemas.Cost(0.5)}})
}

// node writes node's entry, carrying labels, in its life instance.
func (r *ledgerRig) node(name, instance string, labels map[string]string) {
	r.t.Helper()
	kv, err := r.js.KeyValue(r.t.Context(), schemas.NodesBucket)
	if err != nil {
		r.t.Fatal(err)
	}
	b, _ := json.Marshal(schemas.NodeRecord{Name: name, Instance: instance, Labels: labels})
	if _, err := kv.Put(r.t.Context(), name, b); err != nil {
		r.t.Fatal(err)
	}
}

// written is the count as the ledger wrote it.
func (r *ledgerRig) written() schemas.Spent {
	r.t.Helper()
	kv, err := r.js.KeyValue(r.t.Context(), schemas.BudgetsBucket)
	if err != nil {
		r.t.Fatal(err)
	}
	var s schemas.Spent
	if e, err := kv.Get(r.t.Context(), schemas.SpentKey); err == nil {
		json.Unmarshal(e.Value(), &s)
	}
	return s
}

// lastSeq is the stream's last sequence.
func (r *ledgerRig) lastSeq() uint64 {
	r.t.Helper()
	st, err := r.js.Stream(r.t.Context(), schemas.StreamName)
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := st.Info(r.t.Context())
	if err != nil {
		r.t.Fatal(err)
	}
	return info.State.LastSeq
}

// run runs a ledger until the returned function stops it.
func (r *ledgerRig) run() (stop func()) {
	r.t.Helper()
	l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: natstest.Connect(r.t, r.srv)})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.t.Context())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	select {
	case <-l.Ready():
	case err := <-done:
		r.t.Fatalf("the ledger did not start: %v", err)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			r.t.Errorf("the ledger: %v", err)
		}
	}
}

// waitWritten waits until the written count reaches the stream's end.
func (r *ledgerRig) waitWritten() schemas.Spent {
	r.t.Helper()
	want := r.lastSeq()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := r.written()
		if s.Seq >= want {
			return s
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the count reached stream sequence %d, not %d", s.Seq, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The ledger counts every result event's usage once, by node, life and
// label, and nothing else on the stream (deltas, a result without usage,
// a stray whose number is another agent's); stopped and started again it
// goes on from the count it wrote, counting nothing twice; a node's new
// life stands apart from its earlier ones; two ledgers at once count the
// same.
func TestLedgerCountsEveryResultOnce(t *testing.T) {
	r := newLedgerRig(t)
	r.node("n1", "life1", map[string]string{"gpu": "yes"})
	r.node("n2", "other", nil)
	for range 3 {
		r.turn("a1", "n1", 100, 20)
	}
	r.turn("a2", "n2", 7, 3)
	r.turn("a2", "n2", 7, 3)
	r.event("a2", "n2", schemas.Result{StopReason: schemas.StopCancelled})
	// A stray on a1's subject, numbered as another agent's event.
	stray := nats.NewMsg(schemas.EventSubject("a1"))
	stray.Data, _ = json.Marshal(schemas.Event{Turn: 9, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: 1e6}}})
	stray.Header.Set(schemas.HeaderMsgID, schemas.MsgID("a2", 99))
	stray.Header.Set(schemas.HeaderNode, "n1")
	if _, err := r.js.PublishMsg(t.Context(), stray); err != nil {
		t.Fatal(err)
	}
	stop := r.run()
	s := r.waitWritten()
	n1 := schemas.Usage{InputTokens: 300, OutputTokens: 60, CostUSD: schemas.Cost(1.5)}
	check := func(what string, got, want schemas.Usage) {
		t.Helper()
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("%s: %s, want %s", what, g, w)
		}
	}
	check("the fleet", s.Fleet(), r.sum)
	check("label gpu=yes", s.Label("gpu=yes"), n1)
	check("n1's life1", s.Counted("n1", "life1"), n1)
	stop()

	// Counted while no ledger ran, n1 in a new life.
	r.turn("a1", "n1", 100, 20)
	r.node("n1", "life2", map[string]string{"gpu": "yes"})
	r.turn("a1", "n1", 100, 20)
	stop = r.run()
	s = r.waitWritten()
	check("the fleet, after a restart", s.Fleet(), r.sum)
	check("n1's earlier life, retired", s.Counted("n1", "life1"), schemas.Usage{})
	check("n1's life2", s.Counted("n1", "life2"), schemas.Usage{InputTokens: 200, OutputTokens: 40, CostUSD: schemas.Cost(1)})
	check("label gpu=yes, after a restart", s.Label("gpu=yes"), schemas.Usage{InputTokens: 500, OutputTokens: 100, CostUSD: schemas.Cost(2.5)})

	// Two at once.
	stop2 := r.run()
	for i := range 20 {
		r.turn(fmt.Sprintf("b%d", i%4), "n2", 1, 1)
	}
	s = r.waitWritten()
	check("the fleet, counted by two ledgers", s.Fleet(), r.sum)
	stop()
	stop2()
	check("the fleet, as written last", r.written().Fleet(), r.sum)
}

// An idle ledger asks little of the stream's leader: with nothing stored,
// its reads slow down (each read of nats.go's ordered consumer makes its
// consumer again, some JetStream requests each), and what is stored after
// the idle time is still counted.
func TestLedgerIdleAsksLittle(t *testing.T) {
	r := newLedgerRig(t)
	r.node("n1", "life1", nil)
	r.turn("a1", "n1", 100, 20)
	stop := r.run()
	defer stop()
	r.waitWritten()
	requests := func() uint64 {
		t.Helper()
		info, err := r.js.AccountInfo(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.API.Total
	}
	time.Sleep(time.Second) // idle long enough to slow down
	before := requests()
	time.Sleep(2 * time.Second)
	if n := requests() - before; n > 60 {
		t.Errorf("an idle ledger made %d JetStream requests in 2s", n)
	}
	r.turn("a1", "n1", 100, 20)
	if s := r.waitWritten(); s.Fleet().InputTokens != 200 {
		t.Errorf("what was stored after the idle time was not counted: %+v", s.Fleet())
	}
}

// A ledger whose server went away stops when it is told to: nats.go's
// ordered consumer tried to make its consumer again forever, whatever
// the caller's context, so a coordinator on an external server that was
// down could not be stopped.
func TestLedgerStopsWhileItsServerIsAway(t *testing.T) {
	r := newLedgerRig(t)
	r.node("n1", "life1", nil)
	r.turn("a1", "n1", 100, 20)
	stop := r.run()
	r.waitWritten()
	r.srv.Shutdown()
	time.Sleep(3 * time.Second) // the ledger's reads fail, and it tries again
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the ledger did not stop in 30s after it was told to, its server away")
	}
}

// A confined node whose results report what no turn uses (a cost of
// 1e308, a negative cost, 2^63-1 tokens, twice) cannot poison the
// fleet's count: the relay refuses each, saying which figure and why, as
// it refuses a heartbeat carrying more labels than a node may; the count
// written still decodes and holds the node's real turn, and another
// node's agent is still answered its allowance under a fleet budget.
func TestLedgerHoldsOutWhatNoTurnUses(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	coord, err := s.B.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: coord})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, l)
	agents, js, _ := givenMine(t, s, ctx)
	refused := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Errorf("%s: %v, want a refusal saying %q", what, err, want)
		}
	}
	labels := map[string]string{}
	for i := range 100 {
		labels[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 100)
	}
	rec, _ := json.Marshal(schemas.NodeRecord{Name: "nb", Instance: "life", Labels: labels})
	_, err = js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayBeat), rec)
	refused("a heartbeat with 100 labels of 100 bytes", err, "a node carries at most 16 labels, not 100")

	var n uint64
	for _, c := range []struct{ usage, want string }{
		{`{"inputTokens":1,"outputTokens":1,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":1e308}`, `field "data.usage.costUsd": a turn's cost is at most`},
		{`{"inputTokens":1,"outputTokens":1,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":1e308}`, `field "data.usage.costUsd": a turn's cost is at most`},
		{`{"inputTokens":1,"outputTokens":1,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":-5}`, `field "data.usage.costUsd": a cost must not be negative`},
		{`{"inputTokens":9223372036854775807,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":null}`, `field "data.usage.inputTokens": a turn uses at most`},
		{`{"inputTokens":9223372036854775807,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":null}`, `field "data.usage.inputTokens": a turn uses at most`},
	} {
		data := fmt.Appendf(nil, `{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":%s}}`, c.usage)
		_, err := js.PublishMsg(ctx, relayEvent(n+1, data))
		if err == nil {
			n++ // stored: the next event follows it
		}
		refused("a result with usage "+c.usage, err, c.want)
	}
	real, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn,
		Usage: &schemas.Usage{InputTokens: 10, OutputTokens: 5, CostUSD: schemas.Cost(0.5)}}})
	if _, err := js.PublishMsg(ctx, relayEvent(n+1, real)); err != nil {
		t.Fatalf("the node's real result: %v", err)
	}

	// The count reaches the stream's end, and decodes.
	budgets, err := s.F.JetStream().KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := s.F.JetStream().Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var spent schemas.Spent
	for {
		e, err := budgets.Get(ctx, schemas.SpentKey)
		if err == nil {
			spent = schemas.Spent{}
			if derr := json.Unmarshal(e.Value(), &spent); derr != nil {
				t.Fatalf("the count written, %q, does not decode: %v", e.Value(), derr)
			}
			if spent.Seq >= info.State.LastSeq {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the count reached stream sequence %d, not %d", spent.Seq, info.State.LastSeq)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if f := spent.Fleet(); f.InputTokens != 10 || f.OutputTokens != 5 || f.CostUSD == nil || *f.CostUSD != 0.5 {
		t.Errorf("the fleet's count %+v, want the node's real turn alone", f)
	}

	// Another node's agent, under a fleet budget, is answered.
	now := float64(time.Now().Unix())
	claim, _ := json.Marshal(schemas.AgentRecord{ID: "theirs", Node: "honest", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now})
	if _, err := agents.Create(ctx, "theirs", claim); err != nil {
		t.Fatal(err)
	}
	fleet, _ := json.Marshal(schemas.Budget{Tokens: 1000})
	if _, err := budgets.Put(ctx, schemas.FleetBudgetKey, fleet); err != nil {
		t.Fatal(err)
	}
	honest := s.Connect(t, broker.RoleNode, "honest")
	m, err := honest.RequestWithContext(ctx, schemas.RelaySubject("honest", schemas.RelayBudget, "theirs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var a schemas.Allowance
	if err := schemas.DecodeReply(m.Data, &a); err != nil || len(a.Shared) != 1 || a.Shared[0].Used.InputTokens != 10 {
		t.Fatalf("another node's allowance: %+v %v", a, err)
	}
}

// A count written that does not decode (written by a ledger of an earlier
// version) is counted again from the stream's start and written over: a
// restarted ledger does not stop at it.
func TestLedgerCountsAgainACountThatDoesNotDecode(t *testing.T) {
	r := newLedgerRig(t)
	r.node("n1", "life1", nil)
	r.turn("a1", "n1", 100, 20)
	kv, err := r.js.KeyValue(t.Context(), schemas.BudgetsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), schemas.SpentKey, nil); err != nil {
		t.Fatal(err)
	}
	stop := r.run()
	defer stop()
	if s := r.waitWritten(); s.Fleet().InputTokens != 100 {
		t.Errorf("the count, counted again: %+v", s.Fleet())
	}
}

// A count the server will not take (past its payload limit: every node
// name a fleet ever had keeps its rows) was retried at every flush
// without a word, and every node then saw no turn counted. The failure
// is logged, naming its size.
func TestLedgerSaysWhenItCannotWriteTheCount(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, func(c *broker.Config) { c.MaxPayload = 4 << 10 })
	nc, js := natstest.JetStream(t, srv)
	r := &ledgerRig{t: t, srv: srv, nc: nc, js: js, n: map[string]uint64{}}
	var logs lockedBuffer
	l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: natstest.Connect(t, srv), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-l.Ready()
	for i := range 60 {
		r.turn(fmt.Sprintf("a%d", i), fmt.Sprintf("node-%02d", i), 10, 20)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "cannot write the spend count") {
		if time.Now().After(deadline) {
			t.Fatalf("a count of 60 nodes' rows past a 4 KiB payload limit: nothing logged; the count written reaches %d of %d\n%s", r.written().Seq, r.lastSeq(), logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "bytes=") {
		t.Errorf("the log does not say the count's size:\n%s", logs.String())
	}
}

// A node the coordinator took for lost (a partition, a process stopped
// past its heartbeat) comes back and stores its running turn's own
// result after the coordinator closed the turn with a cancelled result
// carrying the use the node last recorded: the turn was counted twice,
// partly and then whole. It counts once, whole; the agent's next turn as
// it is.
func TestLedgerCountsATurnClosedForALostNodeOnce(t *testing.T) {
	t.Parallel()
	r := newLedgerRig(t)
	stop := r.run()
	defer stop()
	result := func(node string, turn int, in, out int64) {
		r.t.Helper()
		r.n["back"]++
		b, err := json.Marshal(schemas.Event{Turn: turn, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: in, OutputTokens: out}}})
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(schemas.EventSubject("back"))
		m.Data = b
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("back", r.n["back"]))
		m.Header.Set(schemas.HeaderNode, node)
		if _, err := r.js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	result("coordinator", 3, 10, 5) // the monitor's, with the running use
	result("n1", 3, 30, 20)         // the turn's own, the node back
	result("n1", 4, 7, 1)           // the next turn
	var total schemas.Usage
	for _, row := range r.waitWritten().Rows {
		total.Add(row.Usage)
	}
	if total.InputTokens != 37 || total.OutputTokens != 21 {
		t.Errorf("the count holds %d input and %d output tokens; turn 3 used 30 and 20 (closed at 10 and 5), turn 4 7 and 1", total.InputTokens, total.OutputTokens)
	}
}
