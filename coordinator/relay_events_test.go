package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// One node's flood of events waits on that node alone. Node evil
// publishes events from eight goroutines, 4000 unanswered at any time,
// for agents it was not given (made-up ids, and node honest's own agent),
// each costing the relay a read of the agents bucket, while node honest's
// agent streams events. Each of honest's events is acknowledged within
// 800 ms (well under a node's publisher's ack wait of 2 s, and under the
// 1.15 s the flood took before; loose enough for a loaded CI machine under
// the race detector) all through the flood, and they are all stored, in order, gapless; evil's are each
// refused as not its agent's (or answered that evil is busy, should more
// wait than its lane holds), and none is stored.
func TestRelayKeepsAnEventFloodToItsNode(t *testing.T) {
	t.Parallel()
	const bound = 800 * time.Millisecond
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 3*time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	claim, _ := json.Marshal(schemas.AgentRecord{ID: "pal", Node: "honest", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now})
	if _, err := agents.Create(ctx, "pal", claim); err != nil {
		t.Fatal(err)
	}
	honest, err := jetstream.New(s.Connect(t, broker.RoleNode, "honest"))
	if err != nil {
		t.Fatal(err)
	}
	event := func(node, agent string, n uint64, data []byte) *nats.Msg {
		m := nats.NewMsg(schemas.RelaySubject(node, schemas.RelayEvent, agent))
		m.Data = data
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(agent, n))
		m.Header.Set(schemas.HeaderNode, node)
		return m
	}
	var n uint64
	stream := func(count int, during string) (slowest time.Duration) {
		t.Helper()
		for range count {
			n++
			data, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(fmt.Sprintf("chunk %d", n))}})
			began := time.Now()
			ack, err := honest.PublishMsg(ctx, event("honest", "pal", n, data))
			took := time.Since(began)
			if err != nil || ack.Duplicate {
				t.Fatalf("node honest's event %d %s: %+v %v after %s", n, during, ack, err, took)
			}
			if took > bound {
				t.Fatalf("node honest's event %d took %s to be acknowledged %s, past %s", n, took, during, bound)
			}
			slowest = max(slowest, took)
		}
		return slowest
	}
	alone := stream(100, "alone")

	// The flood: each of evil's eight publishers keeps 500 events
	// unanswered, for ids it was not given.
	evil := s.Connect(t, broker.RoleNode, "evil")
	var refused, busy, answered atomic.Int64
	var otherMu sync.Mutex
	var other []error
	answer := func(_ jetstream.JetStream, _ *nats.Msg, err error) {
		answered.Add(1)
		var apiErr *jetstream.APIError
		switch {
		case errors.As(err, &apiErr) && apiErr.Code == schemas.RelayRefused && strings.Contains(apiErr.Description, "node evil may not store events of agent"):
			refused.Add(1)
		case errors.As(err, &apiErr) && apiErr.Code == 503 && strings.Contains(apiErr.Description, "node evil has"):
			busy.Add(1)
		default:
			otherMu.Lock()
			other = append(other, err)
			otherMu.Unlock()
		}
	}
	flood, stop := context.WithCancel(ctx)
	var floods sync.WaitGroup
	var publishers []jetstream.JetStream
	defer floods.Wait()
	defer stop()
	forged, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("forged")}})
	for g := range 8 {
		js, err := jetstream.New(evil, jetstream.WithPublishAsyncMaxPending(500), jetstream.WithPublishAsyncErrHandler(answer))
		if err != nil {
			t.Fatal(err)
		}
		publishers = append(publishers, js)
		floods.Add(1)
		go func() {
			defer floods.Done()
			for i := uint64(1); flood.Err() == nil; i++ {
				id := fmt.Sprintf("g%dx%x", g, i%4096)
				if i%8 == 0 {
					id = "pal"
				}
				if _, err := js.PublishMsgAsync(event("evil", id, i, forged)); err != nil && !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					if flood.Err() == nil {
						t.Errorf("node evil's publisher %d: %v", g, err)
					}
					return
				}
			}
		}()
	}
	for refused.Load() < 100 {
		select {
		case <-ctx.Done():
			t.Fatalf("node evil's flood is not answered: %d refused, %d busy", refused.Load(), busy.Load())
		case <-time.After(10 * time.Millisecond):
		}
	}
	before := answered.Load()
	during := stream(300, "during node evil's flood")
	if answered.Load() == before {
		t.Fatal("node evil's flood was not answered while node honest streamed: it did not last")
	}
	t.Logf("node honest's slowest acknowledgement: %s alone, %s during node evil's flood (%d of evil's events refused, %d answered busy)", alone, during, refused.Load(), busy.Load())
	stop()
	floods.Wait()
	for _, js := range publishers {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatalf("node evil's events are not all answered: %d pending", js.PublishAsyncPending())
		}
	}

	if len(other) > 0 {
		t.Errorf("%d of node evil's events were answered otherwise than refused or busy, the first: %v", len(other), other[0])
	}
	if refused.Load() == 0 {
		t.Errorf("none of node evil's events was refused as not its agent's (%d answered busy)", busy.Load())
	}
	stored := storedNumbers(t, ctx, s, "pal")
	if len(stored) != int(n) {
		t.Fatalf("the stream holds %d events of node honest's agent, want %d", len(stored), n)
	}
	for i, got := range stored {
		if got != uint64(i+1) {
			t.Fatalf("the stream holds event %d of node honest's agent at place %d: not in order, gapless", got, i+1)
		}
	}
	st, err := s.F.JetStream().Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != n {
		t.Fatalf("the stream holds %+v (%v); want only node honest's %d events", info.State, err, n)
	}
}

// A node's publisher takes a busy answer as it takes any failure to
// store: it sends again from the event answered busy, and the stream
// holds each of the agent's events once, in order, gapless. Here the
// relay lets 4 of a node's events wait, far fewer than the node's window
// (with 32 the relay kept up now and then, its node heard on a door of
// its own, and nothing was answered busy).
func TestConfinedNodeStoresThroughBusyAnswers(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) {
		c.EventsWaiting = 4
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 3*time.Minute)
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "stream 3000"})
	if err != nil {
		t.Fatalf("a turn of 3000 chunks: %+v %v", run, err)
	}
	if !strings.Contains(logs.String(), "answered busy") {
		t.Errorf("no event of node a's was answered busy; the relay logged:\n%s", logs.String())
	}
	// The run is answered when the turn ends on the node; its events,
	// slowed by the busy answers, may still be on their way.
	var stored []uint64
	poll.Until(t, 2*time.Minute, "the turn's events all stored", func() bool {
		stored = storedNumbers(t, ctx, s, "pal")
		return len(stored) > 3000
	})
	for i, got := range stored {
		if got != uint64(i+1) {
			t.Fatalf("the stream holds event %d of agent pal at place %d: not each once, in order, gapless", got, i+1)
		}
	}
}

// An agent reopened on another node: its new owner's events follow the
// old owner's in the stream, numbered on, while the old owner keeps
// sending, from a lane of its own, copies of its stored events and events
// numbered as the agent's next, across the moment of the reopen (when the
// relay's view of the owner may lag). The old owner's are each refused or
// answered as duplicates, none stored; the new owner's are all stored,
// each once, after the old life's, in order, gapless.
func TestRelayKeepsAReopenedAgentsNumbering(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 2*time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	life := schemas.AgentRecord{ID: "roam", Node: "a", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "r1"}
	put := func(rec schemas.AgentRecord) {
		t.Helper()
		b, _ := json.Marshal(rec)
		if _, err := agents.Put(ctx, "roam", b); err != nil {
			t.Fatal(err)
		}
	}
	put(life)
	node := func(name string) jetstream.JetStream {
		js, err := jetstream.New(s.Connect(t, broker.RoleNode, name))
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	a, b := node("a"), node("b")
	event := func(name string, n uint64, p schemas.Payload) *nats.Msg {
		m := nats.NewMsg(schemas.RelaySubject(name, schemas.RelayEvent, "roam"))
		m.Data, _ = schemas.Encode(schemas.Event{Turn: 1, Payload: p})
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("roam", n))
		m.Header.Set(schemas.HeaderNode, name)
		return m
	}
	text := func(s string) schemas.Payload { return schemas.AssistantText{Content: schemas.Text(s)} }
	for n := uint64(1); n <= 3; n++ {
		if _, err := a.PublishMsg(ctx, event("a", n, text("a's"))); err != nil {
			t.Fatalf("node a's event %d: %v", n, err)
		}
	}
	ended := life
	ended.Status = schemas.StatusDead
	put(ended)
	if _, err := a.PublishMsg(ctx, event("a", 4, schemas.Status{Status: schemas.StatusDead})); err != nil {
		t.Fatalf("node a's dead status: %v", err)
	}

	// Node a keeps sending, from four goroutines, while the agent is
	// reopened on node b.
	var stored atomic.Int64
	var unexpected sync.Map
	late, stop := context.WithCancel(ctx)
	var senders sync.WaitGroup
	defer senders.Wait()
	defer stop()
	for g := range 4 {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for i := uint64(g); late.Err() == nil; i++ {
				ack, err := a.PublishMsg(late, event("a", 1+i%6, text("a's, late")))
				var apiErr *jetstream.APIError
				switch {
				case late.Err() != nil:
				case err == nil && !ack.Duplicate:
					stored.Add(1)
				case err == nil, errors.As(err, &apiErr) && apiErr.Code == schemas.RelayRefused:
				default:
					unexpected.Store(err.Error(), true)
				}
			}
		}()
	}
	reopened := life
	reopened.Node, reopened.RequestID = "b", "r2"
	put(reopened)
	const last = 200
	for n := uint64(5); n <= last; n++ {
		ack, err := b.PublishMsg(ctx, event("b", n, text("b's")))
		if err != nil || ack.Duplicate {
			t.Fatalf("node b's event %d: %+v %v", n, ack, err)
		}
	}
	stop()
	senders.Wait()
	unexpected.Range(func(k, _ any) bool {
		t.Errorf("node a's late event answered: %s", k)
		return true
	})
	if stored.Load() > 0 {
		t.Errorf("%d of node a's late events were stored", stored.Load())
	}
	got := storedNumbers(t, ctx, s, "roam")
	if len(got) != last {
		t.Fatalf("the stream holds %d events of agent roam, want %d", len(got), last)
	}
	for i, n := range got {
		if n != uint64(i+1) {
			t.Fatalf("the stream holds event %d of agent roam at place %d: not each once, in order, gapless", n, i+1)
		}
	}
}

// storedNumbers reads the numbers of agent id's events as the stream
// holds them, in its order.
func storedNumbers(t *testing.T, ctx context.Context, s *fabrictest.Secured, id string) []uint64 {
	t.Helper()
	cons, err := s.F.JetStream().OrderedConsumer(ctx, schemas.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for uint64(len(out)) < info.NumPending {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			_, n, err := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID))
			if err != nil {
				t.Fatalf("an event of agent %s without a valid message id: %v", id, err)
			}
			out = append(out, n)
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
	}
	return out
}

// lockedBuffer is a log's output, written from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Every reader of agent.* sees the reply subject of each event the relay
// forwards, where JetStream acknowledges it to the relay: it was an inbox
// of the coordinator's, and the fabric service answers any inbox a
// requester names, with the coordinator's rights, so an observer could
// have it answer there, into the relay's acknowledgements. It is no inbox
// now: the service answers nothing there.
func TestRelayForwardsUnderAReplySubjectTheServiceNeverAnswers(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "seen", Node: "a", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "r1"})
	if _, err := agents.Put(ctx, "seen", rec); err != nil {
		t.Fatal(err)
	}
	watcher := s.Connect(t, broker.RoleObserver, "watcher")
	events, err := watcher.SubscribeSync(schemas.EventSubject("seen"))
	if err != nil {
		t.Fatal(err)
	}
	watcher.Flush()
	js, err := jetstream.New(s.Connect(t, broker.RoleNode, "a"))
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(schemas.RelaySubject("a", schemas.RelayEvent, "seen"))
	m.Data, _ = schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hi")}})
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("seen", 1))
	m.Header.Set(schemas.HeaderNode, "a")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("node a's event: %v", err)
	}
	got, err := events.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if service.IsInbox(got.Reply) || !strings.HasPrefix(got.Reply, schemas.RelayAckPrefix+".") {
		t.Errorf("an event the relay forwarded has the reply subject %q, which the fabric service would answer", got.Reply)
	}
}
