package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// agedRelayPool is a secured broker whose relay the test restarts (a
// coordinator restart), with agent "mine" claimed for node nb; age drops
// every event of mine from the stream, as retention does.
func agedRelayPool(t *testing.T) (ctx context.Context, kv jetstream.KeyValue, nb jetstream.JetStream, restart func(), claim schemas.AgentRecord, stored func() []uint64, reader *client.Direct, age func()) {
	t.Helper()
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, func(c *broker.Config) { c.Auth = auth })
	coord, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	stop := runRelay(t, coord)
	reader, err = client.NewDirect(coord, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var nbConn *nats.Conn
	restart = func() {
		stop()
		stop = runRelay(t, coord)
		// A node with no heartbeat entry and no living agent gets its
		// door at the new relay by its next words.
		fabrictest.Hello(t, nbConn, "nb")
	}
	s := &fabrictest.Secured{B: b, Auth: auth}
	ctx = natstest.Context(t, 90*time.Second)
	js0, _ := jetstream.New(coord)
	kv, err = js0.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	claim = schemas.AgentRecord{ID: "mine", Node: "nb", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now, RequestID: "r1"}
	c, _ := json.Marshal(claim)
	if _, err := kv.Create(ctx, "mine", c); err != nil {
		t.Fatal(err)
	}
	nbConn = s.Connect(t, broker.RoleNode, "nb")
	nb, err = jetstream.New(nbConn)
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := js0.Stream(ctx, schemas.StreamName)
	age = func() {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(schemas.EventSubject("mine"))); err != nil {
			t.Fatal(err)
		}
	}
	stored = func() []uint64 {
		cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject("mine")}})
		if err != nil {
			t.Fatal(err)
		}
		var ns []uint64
		for {
			m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return ns
			}
			_, n, _ := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID))
			if v := m.Headers().Get(schemas.HeaderAcked); v != "" {
				t.Errorf("event %d is stored with %s: %s; the header is the relay's to read, never stored", n, schemas.HeaderAcked, v)
			}
			ns = append(ns, n)
		}
	}
	return
}

// An honest node's record says it numbered events 4..6 that the relay
// had not stored when the coordinator went away (its outbox holds them).
// After the restart the node's window is in flight: event 4 is answered
// 503 (busy lane, an unsure read, a relay stopping: "send it again") while
// 5 is already on its way. A relay that took a living agent's next number
// from its record when the stream held none past it (c3f43dc, taken out)
// stored 5 before 4, and readers stopped at 4. Event 5 is refused, and
// the node's publisher, already failed, sends 4, 5, 6 again in order.
func TestRelayStoresAnHonestNodesRetriedEventsInOrder(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, restart, claim, stored, reader, _ := agedRelayPool(t)
	for n := uint64(1); n <= 3; n++ {
		if _, err := nb.PublishMsg(ctx, relayEvent(n, textEnv(fmt.Sprintf("event %d", n)))); err != nil {
			t.Fatal(err)
		}
	}
	rec := claim
	rec.Status, rec.EventLog, rec.LastEvent, rec.Turn = schemas.StatusWorking, "/x", 6, 1
	if err := writeOwnRecord(t, ctx, kv, nb, "nb", rec); err != nil {
		t.Fatalf("nb's record: %v", err)
	}
	restart()
	// Event 4 was answered 503; 5 was behind it in the window.
	if _, err := nb.PublishMsg(ctx, relayEvent(5, textEnv("event 5"))); err != nil {
		t.Logf("event 5 before 4: %v (refused, as before c3f43dc)", err)
	}
	// The node sends its unacknowledged tail again, in order.
	for n := uint64(4); n <= 6; n++ {
		ack, err := nb.PublishMsg(ctx, relayEvent(n, textEnv(fmt.Sprintf("event %d", n))))
		if err != nil {
			t.Fatalf("event %d sent again: %v", n, err)
		}
		t.Logf("event %d: %+v", n, ack)
	}
	got := stored()
	page, err := reader.Events(ctx, schemas.EventsRequest{AgentID: "mine", IncludeDeltas: true})
	if err != nil {
		t.Fatal(err)
	}
	var read []uint64
	for _, e := range page.Events {
		read = append(read, e.N)
	}
	if more, err := reader.Events(ctx, schemas.EventsRequest{AgentID: "mine", IncludeDeltas: true, FromEvent: page.NextEvent}); err == nil {
		t.Logf("reading on after %d: %d events, gaps %+v, next %d", page.NextEvent, len(more.Events), more.Gaps, more.NextEvent)
		for _, e := range more.Events {
			read = append(read, e.N)
		}
	} else {
		t.Logf("reading on after %d: %v", page.NextEvent, err)
	}
	if fmt.Sprint(got) != fmt.Sprint([]uint64{1, 2, 3, 4, 5, 6}) || fmt.Sprint(read) != fmt.Sprint([]uint64{1, 2, 3, 4, 5, 6}) {
		t.Errorf("the stream holds events %v of agent mine, in that order; a reader reads %v (gaps %+v); the node was told 1..6 were all stored", got, read, page.Gaps)
	}
}

// A confined node skips thousands of numbers of its own agent's stream
// (which "a number that skips ahead is refused" says it may not): it
// writes last_event 4,096 past what it sent (within holdNumbering's
// allowance), and after a coordinator restart its next event may be
// another 4,096 past that: a relay taking a living agent's next number
// from its record (c3f43dc, taken out) stored it, though the stream held
// every event the agent ever sent (none aged out).
func TestRelayRefusesASkipAfterARestart(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, restart, claim, stored, _, _ := agedRelayPool(t)
	for n := uint64(1); n <= 3; n++ {
		if _, err := nb.PublishMsg(ctx, relayEvent(n, textEnv("real"))); err != nil {
			t.Fatal(err)
		}
	}
	rec := claim
	rec.Status, rec.EventLog, rec.LastEvent = schemas.StatusIdle, "/x", 3+4096
	if err := writeOwnRecord(t, ctx, kv, nb, "nb", rec); err != nil {
		t.Fatalf("nb's record: %v", err)
	}
	restart()
	// Whether or not it says every event up to the one before is stored.
	skip := relayEvent(3+2*4096, textEnv("skips 8191 numbers"))
	skip.Header.Set(schemas.HeaderAcked, strconv.Itoa(3+2*4096-1))
	_, err := nb.PublishMsg(ctx, skip)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("event %d after event 3 was not refused (err %v); the stream holds %v", 3+2*4096, err, stored())
	}
}

// A living agent numbered 10,000 events over 5,000 turns; they aged out
// of the stream. The coordinator restarts; the user sends a turn: the
// node writes its record (turn 5001, last_event 10000) before the send is
// answered. The relay, having seen none of the agent's events, held it to
// 4,096 and 4,096: the next life's claim would have carried turns_before
// 4096 and handed turn numbers 4097..5001 out again. A record is never
// held below what its live record says. (The agent's next event after
// that restart is TestRelayTakesTheNodesWordOnceALivingAgentsEventsAgedOut's.)
func TestRelayKeepsALivingAgentsRecordWhoseEventsAgedOut(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, restart, claim, _, _, _ := agedRelayPool(t)
	// Where the agent stood when its events aged out (the relay that
	// took its record then had seen them).
	rec := claim
	rec.Status, rec.EventLog, rec.LastEvent, rec.Turn = schemas.StatusIdle, "/x", 10000, 5000
	e, _ := kv.Get(ctx, "mine")
	v, _ := json.Marshal(rec)
	if _, err := kv.Update(ctx, "mine", v, e.Revision()); err != nil {
		t.Fatal(err)
	}
	restart()
	send := rec
	send.Status, send.Turn = schemas.StatusIdle, 5001
	if err := writeOwnRecord(t, ctx, kv, nb, "nb", send); err != nil {
		t.Fatalf("the send's record: %v", err)
	}
	e, _ = kv.Get(ctx, "mine")
	var now schemas.AgentRecord
	json.Unmarshal(e.Value(), &now)
	if now.LastEvent != 10000 || now.Turn != 5001 {
		t.Errorf("the node wrote last_event 10000, turn 5001; the record says last_event %d, turn %d", now.LastEvent, now.Turn)
	}
}

// sendAcked sends events from..to of mine as node nb, each naming the one
// before it stored.
func sendAcked(t *testing.T, ctx context.Context, nb jetstream.JetStream, from, to uint64) {
	t.Helper()
	for n := from; n <= to; n++ {
		if _, err := nb.PublishMsg(ctx, ackedEvent(n, n-1, textEnv(fmt.Sprintf("event %d", n)))); err != nil {
			t.Fatalf("event %d: %v", n, err)
		}
	}
}

// ackedEvent is relayEvent naming the node's last event of mine stored.
func ackedEvent(n, acked uint64, data []byte) *nats.Msg {
	m := relayEvent(n, data)
	m.Header.Set(schemas.HeaderAcked, strconv.FormatUint(acked, 10))
	return m
}

// A living agent whose events have all aged out of the stream goes on
// after a coordinator restart: the relay, started afresh, found nothing of
// it in the stream and refused its next event (the node dropped it, and
// every one after). The node's word (schemas.HeaderAcked) says where its
// numbering stands, within what its record says it numbered: an event
// past the one after it is answered "send again" (the node sends what
// comes before it first), one without it is refused as before, and one
// past what the record allows is refused.
func TestRelayTakesTheNodesWordOnceALivingAgentsEventsAgedOut(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, restart, claim, stored, _, age := agedRelayPool(t)
	sendAcked(t, ctx, nb, 1, 3)
	rec := claim
	rec.Status, rec.EventLog, rec.LastEvent, rec.Turn = schemas.StatusIdle, "/x", 3, 1
	if err := writeOwnRecord(t, ctx, kv, nb, "nb", rec); err != nil {
		t.Fatalf("nb's record: %v", err)
	}
	age()
	restart()
	var apiErr *jetstream.APIError
	// Without the node's word, as before.
	if _, err := nb.PublishMsg(ctx, relayEvent(4, textEnv("event 4"))); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("event 4 without the node's word: %v; want it refused", err)
	}
	// Past what the record says the node numbered.
	far := uint64(3 + 4096 + 10)
	if _, err := nb.PublishMsg(ctx, ackedEvent(far+1, far, textEnv("far"))); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("event %d, the node saying %d is stored, its record saying 3: %v; want it refused", far+1, far, err)
	}
	// Event 4 was answered 503 in a restart's window; 5 comes first.
	if _, err := nb.PublishMsg(ctx, ackedEvent(5, 3, textEnv("event 5"))); !errors.As(err, &apiErr) || apiErr.Code != 503 {
		t.Errorf("event 5 before 4, the node saying 3 is stored: %v; want it answered 503, to be sent again", err)
	}
	for n := uint64(4); n <= 6; n++ {
		if _, err := nb.PublishMsg(ctx, ackedEvent(n, 3, textEnv(fmt.Sprintf("event %d", n)))); err != nil {
			t.Fatalf("event %d, the node saying 3 is stored: %v", n, err)
		}
	}
	if got := fmt.Sprint(stored()); got != fmt.Sprint([]uint64{4, 5, 6}) {
		t.Errorf("after its events aged out and the relay restarted, the stream holds events %s of the living agent; want [4 5 6]", got)
	}
}

// A confined node's fresh agent (no event yet, no aging, no coordinator
// restart) is "unknown" to the relay: the stream holds none of its
// current life and the relay has forwarded none. With Shoal-Acked the node
// skips thousands of numbers at its first event, which "a number that
// skips ahead is refused" says it may not. And the bound on its word, its
// record's last_event + 4,096, is no bound: holdNumbering lets each record
// write run 4,096 past the live record, so ten writes let it skip 45,000
// numbers (a million writes, 4 billion). The word is taken only for a
// life that had numbered events when the relay first read its record,
// within what that record said; writes no longer ratchet it on.
func TestRelayRefusesAFreshAgentsSkipOnTheNodesWord(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, _, claim, stored, _, _ := agedRelayPool(t)
	rec := claim
	rec.Status, rec.EventLog = schemas.StatusIdle, "/x"
	for i := 1; i <= 10; i++ {
		rec.LastEvent = uint64(i) * 4096
		if err := writeOwnRecord(t, ctx, kv, nb, "nb", rec); err != nil {
			t.Fatalf("record write %d: %v", i, err)
		}
	}
	e, _ := kv.Get(ctx, "mine")
	t.Logf("after ten record writes the record holds: %s", e.Value())
	n := uint64(10*4096 + 4096 + 1)
	_, err := nb.PublishMsg(ctx, ackedEvent(n, n-1, textEnv("skips")))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("the first event of a fresh agent, numbered %d, was not refused (err %v); the stream holds %v of it", n, err, stored())
	}
}

// A confined node's agent died (its dead status is stored, its record
// says dead); its events aged out and the coordinator restarted. The node
// writes on after the dead status: event last_event+1, naming last_event
// acknowledged: "nothing follows the dead status that ended a life until
// the agent is given a new one" holds on the node's word too.
func TestRelayRefusesEventsAfterADeathOnTheNodesWord(t *testing.T) {
	t.Parallel()
	ctx, kv, nb, restart, claim, stored, _, age := agedRelayPool(t)
	sendAcked(t, ctx, nb, 1, 3)
	rec := claim
	rec.Status, rec.EventLog, rec.LastEvent, rec.Turn = schemas.StatusDead, "/x", 4, 1
	if err := writeOwnRecord(t, ctx, kv, nb, "nb", rec); err != nil {
		t.Fatalf("nb's dead record: %v", err)
	}
	dead, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusDead}})
	if _, err := nb.PublishMsg(ctx, ackedEvent(4, 3, dead)); err != nil {
		t.Fatalf("the dead status: %v", err)
	}
	var apiErr *jetstream.APIError
	if _, err := nb.PublishMsg(ctx, ackedEvent(5, 4, textEnv("after death, before aging"))); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Fatalf("event 5 after the dead status, before aging: %v; want refused", err)
	}
	age()
	restart()
	_, err := nb.PublishMsg(ctx, ackedEvent(5, 4, textEnv("after death")))
	if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("event 5 of dead agent mine, after its dead status (event 4): err %v, want refused; the stream holds %v", err, stored())
	}
}
