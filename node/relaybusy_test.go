package node

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A relay answering busy (the node's share of its work was full: nothing
// was done) is asked again: a record write and a question each go
// through once the relay has room, and one that never has room fails
// when its context ends, saying so.
func TestRelayStoreAsksAgainWhileTheRelayIsBusy(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	relay := natstest.Connect(t, b)
	var asked atomic.Int64
	busy := func(m *nats.Msg, body string) {
		a := nats.NewMsg(m.Reply)
		a.Header.Set(schemas.HeaderRelayBusy, "72")
		a.Data = []byte(body)
		relay.PublishMsg(a)
	}
	if _, err := relay.Subscribe(schemas.RelaySubject("n1", schemas.RelayRecord, "a1"), func(m *nats.Msg) {
		if asked.Add(1) <= 3 {
			busy(m, `{"error":{"code":503,"description":"node n1 has 72 relay operations running or waiting already"}}`)
			return
		}
		m.Respond([]byte(`{"stream":"KV_shoal_agents","seq":42}`))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Subscribe(schemas.RelaySubject("n1", schemas.RelayOwned), func(m *nats.Msg) {
		busy(m, `{"error":{"code":"unavailable","message":"node n1 has 72 relay operations running or waiting already"}}`)
	}); err != nil {
		t.Fatal(err)
	}
	relay.Flush()
	s := &relayStore{nc: natstest.Connect(t, b), node: "n1"}
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "a1"})
	seq, err := s.update(natstest.Context(t, 30e9), "a1", rec, 7)
	if err != nil || seq != 42 || asked.Load() != 4 {
		t.Fatalf("a record write through a relay busy three times: seq %d, %v, asked %d times", seq, err, asked.Load())
	}
	_, err = s.owned(natstest.Context(t, 1e9))
	if err == nil || !strings.Contains(err.Error(), "the relay was busy with this node's other operations") {
		t.Errorf("a question the relay never has room for: %v", err)
	}
}

// A bundle's chunks are asked again while the relay is busy, as the
// relay answers them then (an error, and busy): a read and a write of a
// bundle go through once it has room. Before, the first busy answer
// failed the agent's open.
func TestRelayStoreAsksAgainForABundleWhileTheRelayIsBusy(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	relay := natstest.Connect(t, b)
	busy := func(m *nats.Msg) {
		a := nats.NewMsg(m.Reply)
		a.Header.Set(schemas.HeaderRelayError, "1")
		a.Header.Set(schemas.HeaderRelayBusy, "264")
		a.Data = []byte(`{"error":{"code":"unavailable","message":"node n1 has 264 relay operations running or waiting already"}}`)
		relay.PublishMsg(a)
	}
	var gets, puts atomic.Int64
	var mu sync.Mutex
	var stored bytes.Buffer
	if _, err := relay.Subscribe(schemas.RelaySubject("n1", schemas.RelayBundleGet, "a1"), func(m *nats.Msg) {
		if gets.Add(1) <= 2 {
			busy(m)
			return
		}
		a := nats.NewMsg(m.Reply)
		a.Header.Set(schemas.HeaderBundleLast, "1")
		a.Data = []byte("bundle")
		relay.PublishMsg(a)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Subscribe(schemas.RelaySubject("n1", schemas.RelayBundlePut, "a1"), func(m *nats.Msg) {
		if puts.Add(1) <= 2 {
			busy(m)
			return
		}
		mu.Lock()
		stored.Write(m.Data)
		mu.Unlock()
		m.Respond([]byte(`{}`))
	}); err != nil {
		t.Fatal(err)
	}
	relay.Flush()
	s := &relayStore{nc: natstest.Connect(t, b), node: "n1"}
	var got bytes.Buffer
	if err := s.getBundle(natstest.Context(t, 30e9), "a1", "repo/x.bundle", &got); err != nil || got.String() != "bundle" || gets.Load() != 3 {
		t.Errorf("a bundle read through a relay busy twice: %q, %v (asked %d times)", got.String(), err, gets.Load())
	}
	err := s.putBundle(natstest.Context(t, 30e9), "a1", "repo/y.bundle", "", strings.NewReader("written"))
	mu.Lock()
	defer mu.Unlock()
	if err != nil || stored.String() != "written" || puts.Load() != 3 {
		t.Errorf("a bundle written through a relay busy twice: stored %q, %v (sent %d times)", stored.String(), err, puts.Load())
	}
}

// A question whose answer is lost (the coordinator that took it killed
// before it answered, a connection cut as the answer went) got none, and
// the node waited the whole of its caller's deadline: an open's reads
// waited most of a minute through a coordinator restart. A question is
// asked again once relayAskAgain has passed without an answer, within its
// caller's deadline.
func TestRelayStoreAsksAgainAQuestionLeftUnanswered(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	relay := natstest.Connect(t, b)
	var asked atomic.Int64
	if _, err := relay.Subscribe(schemas.RelaySubject("n1", schemas.RelayGet, "a1"), func(m *nats.Msg) {
		if asked.Add(1) == 1 {
			return // taken, and never answered
		}
		rep, _ := json.Marshal(schemas.RelayEntry{Found: true, Revision: 9, Value: []byte(`{"id":"a1"}`)})
		m.Respond(rep)
	}); err != nil {
		t.Fatal(err)
	}
	relay.Flush()
	s := &relayStore{nc: natstest.Connect(t, b), node: "n1"}
	e, err := s.get(natstest.Context(t, 3*relayAskAgain), "a1")
	if err != nil || e.rev != 9 || asked.Load() != 2 {
		t.Fatalf("a question whose first answer was lost: %+v, %v, asked %d times; want revision 9, asked twice", e, err, asked.Load())
	}
}
