package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
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

// writeOwnRecord is what a confined node may do: write its agent's record
// through the relay, compare-and-set on the key's revision.
func writeOwnRecord(t *testing.T, ctx context.Context, kv jetstream.KeyValue, js jetstream.JetStream, node string, rec schemas.AgentRecord) error {
	t.Helper()
	e, err := kv.Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(schemas.RelaySubject(node, schemas.RelayRecord, rec.ID))
	m.Data, _ = json.Marshal(rec)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(e.Revision(), 10))
	_, err = js.PublishMsg(ctx, m)
	return err
}

func textEnv(s string) []byte {
	b, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(s)}})
	return b
}

// A confined node wrote events_before in its own record, and the relay
// took it as its agent's stored numbering: the node's next event could
// then skip a million numbers, which "a number that skips ahead is
// refused" says it may not. What a claim carries of an id's earlier lives
// is the claim's: the relay refuses a node's change to it.
func TestRelayRefusesANodesOwnEventsBefore(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	kv, js, claim := givenMine(t, s, ctx)
	for n := uint64(1); n <= 3; n++ {
		if _, err := js.PublishMsg(ctx, relayEvent(n, textEnv(fmt.Sprintf("real %d", n)))); err != nil {
			t.Fatalf("event %d: %v", n, err)
		}
	}
	rec := claim
	rec.Status = schemas.StatusIdle
	rec.EventsBefore = 1_000_000
	if err := writeOwnRecord(t, ctx, kv, js, "nb", rec); err != nil {
		t.Logf("the relay refused the record: %v", err) // what a fix may do
	}
	_, err := js.PublishMsg(ctx, relayEvent(1_000_001, textEnv("skips a million")))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		page, _ := s.F.Events(ctx, schemas.EventsRequest{AgentID: "mine", IncludeDeltas: true})
		t.Fatalf("event 1000001 after event 3 was not refused (err %v); the reader sees events %d, gaps %+v", err, len(page.Events), page.Gaps)
	}
}

// A confined node given an id once could push the numbering of every
// later life of that id, on any node: it wrote last_event as large as it
// liked in its own record, the claim that reopens the id carried it
// (AgentRecord.NextNumbers), and the new life, on an honest node,
// numbered from there: past 2^64-1 the number wrapped, and the relay
// stored none of the new life's events. The relay holds a node's record
// to what it has seen of the agent's numbering (within what a node may
// have numbered and not sent yet).
func TestConfinedNodeCannotPushTheNextLifesNumbering(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "honest")
	ctx := natstest.Context(t, 90*time.Second)
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	claim := schemas.AgentRecord{ID: "pal", Node: "evil", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "r-evil"}
	b, _ := json.Marshal(claim)
	if _, err := kv.Create(ctx, "pal", b); err != nil {
		t.Fatal(err)
	}
	evil, err := jetstream.New(s.Connect(t, broker.RoleNode, "evil"))
	if err != nil {
		t.Fatal(err)
	}
	ev := func(n uint64, data []byte) *nats.Msg {
		m := nats.NewMsg(schemas.RelaySubject("evil", schemas.RelayEvent, "pal"))
		m.Data = data
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("pal", n))
		m.Header.Set(schemas.HeaderNode, "evil")
		return m
	}
	const evils = 30
	for n := uint64(1); n <= evils; n++ {
		if _, err := evil.PublishMsg(ctx, ev(n, textEnv("evil's event"))); err != nil {
			t.Fatal(err)
		}
	}
	// Its life ends, its record saying where its numbering ended.
	rec := claim
	rec.Status = schemas.StatusDead
	rec.EventLog = "/x/pal.events.jsonl"
	rec.LastEvent = math.MaxUint64
	if err := writeOwnRecord(t, ctx, kv, evil, "evil", rec); err != nil {
		t.Fatalf("evil's own record: %v", err)
	}
	dead, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusDead}})
	if _, err := evil.PublishMsg(ctx, ev(evils+1, dead)); err != nil {
		t.Fatalf("evil's dead status: %v", err)
	}

	// Someone reopens the id on the honest node and runs a turn.
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal", Node: "honest"})
	if err != nil {
		t.Fatalf("reopen on honest: %v", err)
	}
	r, _ := s.F.Status(ctx, "pal")
	t.Logf("reopened on %s; the claim carried events_before %d", open.Node, r.EventsBefore)
	if r.EventsBefore > evils+1+4096 {
		t.Errorf("the claim carried events_before %d; evil's life numbered %d", r.EventsBefore, evils+1)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	run, runErr := s.F.Run(rctx, schemas.RunRequest{AgentID: "pal", Text: "hi"})
	cancel()
	t.Logf("run: %+v %v", run, runErr)
	var fromHonest []uint64
	page, err := s.F.Events(ctx, schemas.EventsRequest{AgentID: "pal", IncludeDeltas: true, Max: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page: next %d, gaps %+v, foreign %+v", page.NextEvent, page.Gaps, page.Foreign)
	result := false
	for _, e := range page.Events {
		if e.Node == "honest" {
			t.Logf("event %d from %s: %s", e.N, e.Node, e.Event)
			fromHonest = append(fromHonest, e.N)
			result = result || strings.Contains(string(e.Event), `"kind":"result"`)
		}
	}
	if !result {
		t.Errorf("the honest node's turn of the new life has no result in the stream (the coordinator's count and shoal usage never see it); its events stored: %v", fromHonest)
	}
	if len(fromHonest) == 0 || fromHonest[0] <= evils+1 {
		t.Errorf("the honest node's new life: events %v stored; numbers 1..%d were evil's life's (a number handed out again, the new life's first events acknowledged as duplicates and dropped)", fromHonest, evils+1)
	}
}

// runRelay runs a relay on nc until stop is called, as a coordinator does.
func runRelay(t *testing.T, nc *nats.Conn) (stop func()) {
	t.Helper()
	r, err := coordinator.NewRelay(coordinator.RelayConfig{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("relay: %v", err)
	}
	var once bool
	stop = func() {
		if !once {
			once = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}
