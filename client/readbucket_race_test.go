package client_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
)

// A read of a bucket holds every key there, however often one is
// rewritten meanwhile: an outside review's `shoal open --node n2` failed
// now and then with "no node named n2 is running" while n2 opened and
// closed agents (each rewrites its record), and a read of the nodes missed
// a live one about once in two hundred.
func TestAReadOfABucketHoldsAKeyRewrittenAsItReads(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	ctx := natstest.Context(t, 2*time.Minute)
	// As the nodes bucket keeps them (one entry per key), without its
	// expiry, which would take the keys written once as the test runs.
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "rewrites", History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "busy", "c", "d"}
	for _, k := range keys {
		if _, err := kv.Put(ctx, k, []byte(`{"name":"`+k+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			kv.Put(ctx, "busy", []byte(fmt.Sprintf(`{"name":"busy","n":%d}`, i)))
		}
	})
	defer wg.Wait()
	defer close(stop)
	misses := map[string]int{}
	const reads = 1000
	for range reads {
		seen := map[string]bool{}
		if err := client.ReadBucket(ctx, kv, func(e jetstream.KeyValueEntry) {
			if seen[e.Key()] {
				t.Errorf("key %s read twice in one read", e.Key())
			}
			seen[e.Key()] = true
		}); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !seen[k] {
				misses[k]++
			}
		}
	}
	if len(misses) > 0 {
		t.Errorf("of %d reads, keys missed: %v", reads, misses)
	}
}
