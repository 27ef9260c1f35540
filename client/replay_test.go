package client_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// agentStream publishes an agent's events as a node would.
type agentStream struct {
	t  *testing.T
	js jetstream.JetStream
	id string
	n  uint64
}

func (a *agentStream) emit(turn int, p schemas.Payload) uint64 {
	a.t.Helper()
	a.n++
	env, err := schemas.Encode(schemas.Event{Turn: turn, Payload: p})
	if err != nil {
		a.t.Fatal(err)
	}
	m := nats.NewMsg(schemas.EventSubject(a.id))
	m.Data = env
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(a.id, a.n))
	m.Header.Set(schemas.HeaderNode, "n1")
	if _, err := a.js.PublishMsg(a.t.Context(), m); err != nil {
		a.t.Fatal(err)
	}
	return a.n
}

// turn publishes a whole turn: 8 events.
func (a *agentStream) turn(t int, text string) {
	a.emit(t-1, schemas.UserText{Content: schemas.Text("q" + text)})
	a.emit(t, schemas.Status{Status: schemas.StatusWorking})
	a.emit(t, schemas.TurnStarted{})
	a.emit(t, schemas.AssistantText{Delta: true, Content: schemas.Text(text[:1])})
	a.emit(t, schemas.AssistantText{Content: schemas.Text(text)})
	a.emit(t, schemas.Status{Status: schemas.StatusIdle})
	a.emit(t, schemas.Result{StopReason: schemas.StopEndTurn})
}

// collected keeps what a replay delivered, and every delivered event
// that does not fit the JSON Schema; check reports those.
type collected struct {
	mu      sync.Mutex
	evs     []client.Replayed
	gaps    []client.Gap
	strays  []client.Replayed
	invalid []error
}

func (c *collected) fn(r client.Replayed, g *client.Gap) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Stray != "" {
		c.strays = append(c.strays, r)
		return nil
	}
	if g != nil {
		c.gaps = append(c.gaps, *g)
	}
	if err := schematest.ValidateEvent(r.Raw); err != nil {
		c.invalid = append(c.invalid, fmt.Errorf("event %d of %s %s: %w", r.N, r.Agent, r.Raw, err))
	}
	c.evs = append(c.evs, r)
	return nil
}

// check fails the test for each replayed event the schema rejected.
func (c *collected) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, err := range c.invalid {
		t.Errorf("replayed an invalid event: %v", err)
	}
}

func (c *collected) numbers() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint64
	for _, r := range c.evs {
		out = append(out, r.N)
	}
	return out
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReplayStartingPoints(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "r1"}
	other := &agentStream{t: t, js: js, id: "r2"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle}) // 1
	a.turn(1, "first")                                    // 2-8
	other.turn(1, "noise")
	mid := time.Now()
	a.turn(2, "second") // 9-15
	other.turn(2, "more noise")
	a.turn(3, "third") // 16-22

	run := func(from client.From) *collected {
		t.Helper()
		var c collected
		if err := f.Replay(t.Context(), []string{"r1"}, from, false, c.fn); err != nil {
			t.Fatalf("replay from %+v: %v", from, err)
		}
		c.check(t)
		return &c
	}
	if got := run(client.From{}).numbers(); !equal(got, seq(1, 22)) {
		t.Errorf("from the start: %v", got)
	}
	if got := run(client.From{Event: 7}).numbers(); !equal(got, seq(7, 22)) {
		t.Errorf("from event 7: %v", got)
	}
	c := run(client.From{Turn: 2})
	if got := c.numbers(); !equal(got, seq(9, 22)) || c.evs[0].Kind != schemas.KindUserText {
		t.Errorf("from turn 2: %v, first %s", got, c.evs[0].Kind)
	}
	if got := run(client.From{Time: mid}).numbers(); !equal(got, seq(9, 22)) {
		t.Errorf("from a time: %v", got)
	}
	if err := f.Replay(t.Context(), []string{"r1"}, client.From{Event: 23}, false, func(client.Replayed, *client.Gap) error { return nil }); err != nil {
		t.Errorf("from the next event: %v", err)
	}
	if err := f.Replay(t.Context(), []string{"r1"}, client.From{Event: 99}, false, func(client.Replayed, *client.Gap) error { return nil }); schemas.CodeOf(err) != schemas.CodeNotFound ||
		err.Error() != "agent r1 has 22 events; event 99 is past the end (the next one is 23)" {
		t.Errorf("from beyond the end: %v", err)
	}
	if err := f.Replay(t.Context(), []string{"nobody"}, client.From{}, true, func(client.Replayed, *client.Gap) error { return nil }); schemas.CodeOf(err) != schemas.CodeNotFound ||
		err.Error() != "no such agent: nobody" {
		t.Errorf("an unknown agent: %v", err)
	}
	var all collected
	if err := f.Replay(t.Context(), nil, client.From{}, false, all.fn); err != nil || len(all.evs) != 22+14 {
		t.Errorf("every agent: %d events, %v", len(all.evs), err)
	}
	all.check(t)
	if err := f.Replay(t.Context(), nil, client.From{Event: 3}, false, all.fn); err == nil || !strings.Contains(err.Error(), "names one agent") {
		t.Errorf("from an event number without an agent: %v", err)
	}

	// Retention drops the start of the stream: asking for it says so.
	s, _ := js.Stream(t.Context(), schemas.StreamName)
	if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(10)); err != nil {
		t.Fatal(err)
	}
	err := f.Replay(t.Context(), []string{"r1"}, client.From{Event: 2}, false, func(client.Replayed, *client.Gap) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "events before 9 are past the stream's retention; its history now starts at event 9") {
		t.Errorf("before retention: %v", err)
	}
	// A jump in the numbering is held until the next event tells: as the
	// last event stored, nothing follows it, so it is a stray.
	a.n += 3
	a.emit(3, schemas.Errorf("after a hole"))
	c = run(client.From{Event: 20})
	if got := c.numbers(); len(c.gaps) != 0 || !equal(got, seq(20, 22)) || len(c.strays) != 1 || c.strays[0].N != 26 {
		t.Errorf("a lone jump: events %v, gaps %+v, strays %+v", got, c.gaps, c.strays)
	}
	// Followed by the event after it, it was a hole: reported, not hidden.
	a.emit(3, schemas.Errorf("after that"))
	c = run(client.From{Event: 20})
	if got := c.numbers(); len(c.gaps) != 1 || c.gaps[0].From != 23 || c.gaps[0].To != 25 || !equal(got, append(seq(20, 22), 26, 27)) || len(c.strays) != 0 {
		t.Errorf("a hole: events %v, gaps %+v, strays %+v", got, c.gaps, c.strays)
	}
}

// Replay then live follow on one consumer: no gap and no duplicate at the
// seam; an observer that disconnects mid-turn resumes from its last event
// number and misses nothing.
func TestReplayFollowAndResume(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "live"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	a.turn(1, "history")

	// A producer keeps the turn going while the observer comes and goes.
	produce := make(chan int)
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		for k := range produce {
			for range k {
				a.emit(2, schemas.AssistantText{Delta: true, Content: schemas.Text("x")})
			}
		}
	}()

	var first collected
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan struct{}, 1000)
	go f.Replay(ctx, []string{"live"}, client.From{}, true, func(r client.Replayed, g *client.Gap) error {
		first.fn(r, g)
		got <- struct{}{}
		return nil
	})
	for range 8 {
		<-got // the history
	}
	produce <- 20
	for range 20 {
		<-got // live, past the seam
	}
	cancel() // the observer goes away mid-turn
	last := first.numbers()[len(first.numbers())-1]
	produce <- 30 // the turn goes on without it
	close(produce)
	<-producerDone

	var second collected
	if err := f.Replay(t.Context(), []string{"live"}, client.From{Event: last + 1}, false, second.fn); err != nil {
		t.Fatal(err)
	}
	all := append(first.numbers(), second.numbers()...)
	if !equal(all, seq(1, 58)) || len(first.gaps)+len(second.gaps) != 0 {
		t.Fatalf("events seen across the disconnect: %v (gaps %v %v)", all, first.gaps, second.gaps)
	}
	first.check(t)
	second.check(t)
}

// agent_output's reading of a turn the stream no longer keeps says so.
func TestOutputPastRetention(t *testing.T) {
	t.Parallel()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "old"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle})
	a.turn(1, "first")
	a.turn(2, "second")
	kv, _ := js.KeyValue(t.Context(), schemas.AgentsBucket)
	kv.Put(t.Context(), "old", []byte(`{"id":"old","status":"idle","turn":2,"node":"n1"}`))
	s, _ := js.Stream(t.Context(), schemas.StreamName)
	s.Purge(t.Context(), jetstream.WithPurgeSequence(9)) // turn 1 is gone
	turn := 1
	_, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "old", Turn: &turn})
	if err == nil || !strings.Contains(err.Error(), "turn 1 of agent old is past the stream's retention; its stored history now starts at event 9, and turn 2 is the first it holds whole") {
		t.Fatalf("output of a trimmed turn: %v", err)
	}
	turn = 2
	out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "old", Turn: &turn})
	if err != nil || out.Text != "second" {
		t.Fatalf("output of a kept turn: %+v %v", out, err)
	}
	schematest.ControlValue(t, "output_reply", out)
	// Asked with no turn (as a Kaimon caller almost always asks), the
	// last turn, held; all the turns, turn 1's loss said in the text.
	if out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "old"}); err != nil || out.Text != "second" {
		t.Fatalf("output of the last turn, kept: %+v %v", out, err)
	}
	if out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "old", Which: schemas.WhichAll}); err != nil ||
		out.Text != "— turn 1 is past the stream's retention —\n\n— turn 2 —\n\nsecond" {
		t.Fatalf("output of all the turns, the first one gone: %+v %v", out, err)
	}
	// Once the stream holds none of the agent's events, no answer is an
	// empty text: it was, with no error, unless a turn was named.
	s.Purge(t.Context())
	kv.Put(t.Context(), "old", []byte(`{"id":"old","status":"idle","turn":2,"node":"n1","last_event":16}`))
	for _, which := range []string{"", schemas.WhichFullTurn, schemas.WhichAll} {
		out, err := f.Output(t.Context(), schemas.OutputRequest{AgentID: "old", Which: which})
		if err == nil || !strings.Contains(err.Error(), "past the stream's retention; the stream holds none of its 16 events any more") {
			t.Errorf("output (which %q) of an agent the stream holds nothing of: %+v %v", which, out, err)
		}
	}
}

// streamFabric is a fabric on a fresh broker, with a JetStream client to
// write agents' streams as nodes would.
func streamFabric(t *testing.T) (*client.Direct, jetstream.JetStream) {
	t.Helper()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return f, js
}
