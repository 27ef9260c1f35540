package coordinator

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// kvEntry is one update of a bucket as a watch delivers it.
type kvEntry struct {
	jetstream.KeyValueEntry
	key string
	val []byte
	rev uint64
	op  jetstream.KeyValueOp
}

func (e kvEntry) Key() string                     { return e.key }
func (e kvEntry) Value() []byte                   { return e.val }
func (e kvEntry) Revision() uint64                { return e.rev }
func (e kvEntry) Operation() jetstream.KeyValueOp { return e.op }

// chanWatcher delivers what the test sends it.
type chanWatcher struct{ ch chan jetstream.KeyValueEntry }

func (w chanWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w chanWatcher) Stop() error                             { return nil }

// heldKV's Get read its entry at the server; its answer is taken in only
// once released.
type heldKV struct {
	jetstream.KeyValue
	entry   jetstream.KeyValueEntry
	release chan struct{}
}

func (k heldKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	<-k.release
	return k.entry, nil
}

// A bucket read a lane began before an agent's record was deleted, taken
// in after the watch delivered the deletion, brought the agent back into
// the relay's view (its owner, a status counted): the deletion forgot
// the revision an older read is judged by. It is kept now.
func TestRelayViewKeepsADeletedAgentDeleted(t *testing.T) {
	t.Parallel()
	r, err := NewRelay(RelayConfig{Conn: natstest.Connect(t, natstest.Start(t))})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusDead})
	put := kvEntry{key: "a1", val: rec, rev: 10, op: jetstream.KeyValuePut}
	kv := heldKV{entry: put, release: make(chan struct{})}
	r.agents = kv
	w := chanWatcher{ch: make(chan jetstream.KeyValueEntry)}
	watched := make(chan struct{})
	go func() { r.watchOwners(w, nil); close(watched) }()
	w.ch <- put // the view learns revision 10
	read := make(chan struct{})
	go func() { r.bucketRecord(context.Background(), "a1"); close(read) }()
	w.ch <- kvEntry{key: "a1", rev: 11, op: jetstream.KeyValueDelete}
	w.ch <- nil // the deletion is taken in before the next update is
	close(kv.release)
	<-read
	close(w.ch)
	<-watched
	r.mu.Lock()
	owner, known := r.owners["a1"]
	r.mu.Unlock()
	if known {
		t.Errorf("agent a1's record was deleted (revision 11), yet a read of revision 10 taken in after brought back its owner %q", owner)
	}
	if n := r.AgentsByStatus()[schemas.StatusDead]; n != 0 {
		t.Errorf("%d dead agents counted after the only record was deleted", n)
	}
	// A record written again after the deletion is the agent's again.
	again, _ := json.Marshal(schemas.AgentRecord{ID: "a1", Node: "n2", Status: schemas.StatusIdle})
	w2 := chanWatcher{ch: make(chan jetstream.KeyValueEntry, 1)}
	w2.ch <- kvEntry{key: "a1", val: again, rev: 12, op: jetstream.KeyValuePut}
	close(w2.ch)
	r.watchOwners(w2, nil)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owners["a1"] != "n2" {
		t.Errorf("a record written after the deletion: owner %q, want n2", r.owners["a1"])
	}
}
