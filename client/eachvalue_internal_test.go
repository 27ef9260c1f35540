package client

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// eachValue whose context ends mid-read (a dashboard's request dropped, a
// list whose deadline passes on a bucket of thousands of records) leaves
// no goroutine behind: nats.go's watcher, stopped without its entries
// read, stays blocked sending the next one to its full channel, with the
// subscription's goroutine. The watch is drained as it ends.
func TestEachValueEndedMidReadLeavesNoWatcher(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	ctx := natstest.Context(t, time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "revleak"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if _, err := kv.Put(ctx, fmt.Sprintf("k%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stuck := func() int {
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		return strings.Count(string(buf), "jetstream.(*kvs).WatchFiltered.func1")
	}
	for range 3 {
		rctx, cancel := context.WithCancel(ctx)
		first := true
		err := eachValue(rctx, kv, func(string, []byte) {
			if first {
				// The reader is slower than the watch: its channel fills.
				first = false
				time.Sleep(500 * time.Millisecond)
				cancel()
			}
		})
		cancel()
		if err == nil {
			t.Fatal("eachValue read every key though its context ended at the first")
		}
	}
	time.Sleep(time.Second)
	if n := stuck(); n > 0 {
		t.Errorf("%d watchers' goroutines left blocked sending to a channel nobody reads, after eachValue returned", n)
	}
}
