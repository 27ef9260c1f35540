package client

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A store that cannot read its files (the coordinator out of descriptors)
// delivered a watch's end with none of the bucket's entries, and `shoal
// ls` said "No agents" while agents ran. A read that gives none of the
// entries its bucket holds is an error; an empty bucket's is not.
func TestAReadGivingNoneOfABucketsEntriesFails(t *testing.T) {
	for _, held := range []uint64{0, 3} {
		kv := emptyWatchKV{held: held}
		n := 0
		err := ReadBucket(t.Context(), kv, func(jetstream.KeyValueEntry) { n++ })
		switch {
		case held == 0 && err != nil:
			t.Errorf("an empty bucket's read: %v", err)
		case held > 0 && (err == nil || !strings.Contains(err.Error(), "gave none of the 3 entries it holds")):
			t.Errorf("a read giving none of 3 entries: %v", err)
		}
	}
}

// emptyWatchKV is a bucket holding held entries whose watch gives none.
type emptyWatchKV struct {
	jetstream.KeyValue
	held uint64
}

func (kv emptyWatchKV) Bucket() string { return "shoal_agents" }

func (kv emptyWatchKV) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w := emptyWatch{updates: make(chan jetstream.KeyValueEntry, 1)}
	w.updates <- nil // the initial values are in: none
	return w, nil
}

func (kv emptyWatchKV) Status(context.Context) (jetstream.KeyValueStatus, error) {
	return heldStatus{held: kv.held}, nil
}

type emptyWatch struct {
	jetstream.KeyWatcher
	updates chan jetstream.KeyValueEntry
}

func (w emptyWatch) Updates() <-chan jetstream.KeyValueEntry { return w.updates }
func (w emptyWatch) Stop() error                             { close(w.updates); return nil }

type heldStatus struct {
	jetstream.KeyValueStatus
	held uint64
}

func (s heldStatus) Values() uint64 { return s.held }
