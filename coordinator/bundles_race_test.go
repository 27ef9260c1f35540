package coordinator_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A confined node sending chunks at offset 0 of one bundle eight at a
// time, forty times: each chunk found no write of the name (the others
// had taken it out of the relay's map while they were handled), began
// one, and the one stored last replaced the others, which nothing ever
// ended. Their stores waited for good, their chunks stayed in the store
// past the node's room, and none of them counted among its writes. A
// chunk of a write another chunk is being written to is refused now:
// the store holds no more than the node's room, and the goroutines go.
// Not parallel: it counts the process's goroutines.
func TestRelayRefusesAChunkOfAWriteUnderWay(t *testing.T) {
	const limit = 1 << 20 // the node's room: 2 MiB
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)
	base := strings.Repeat("a", 40)
	name := schemas.WorkBundleName("r1", "nb", "mine", base, nil)
	chunk := bytes.Repeat([]byte("x"), schemas.BundleChunk)
	g0 := runtime.NumGoroutine()
	var refused sync.Map
	for range 40 {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := w.put(name, 0, chunk, false); err != nil {
					refused.Store(err.Error(), true)
				}
			})
		}
		wg.Wait()
	}
	saidSo := false
	refused.Range(func(k, _ any) bool {
		saidSo = saidSo || strings.Contains(k.(string), "a chunk of it is being written already")
		return true
	})
	if !saidSo {
		t.Error("no chunk sent at once with another of its bundle was refused as such")
	}
	// The last write begun is let go: its store ends, and every chunk of
	// it leaves the store.
	if err := w.put(name, 0, []byte("y"), true); err != nil {
		t.Fatalf("the bundle written again whole: %v", err)
	}
	st, err := s.F.JetStream().Stream(ctx, "OBJ_"+schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	poll.Until(t, 30*time.Second, "the begun writes' chunks to leave the store", func() bool {
		info, err = st.Info(ctx)
		return err == nil && info.State.Bytes <= 2*limit
	})
	poll.Until(t, 30*time.Second, "the begun writes' goroutines to end", func() bool {
		return runtime.NumGoroutine() <= g0+20
	})
}

// Eight bundles of different names written side by side, each within
// the largest a node may write: each chunk's check of the node's room
// left out the writes whose chunks were in flight at that moment, and
// the node stored past its room. A chunk's bytes are counted as the room
// is checked now, and writes in flight are counted.
func TestRelayHoldsWritesSideBySideToTheNodesRoom(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20 // the node's room: 2 MiB
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)
	chunk := bytes.Repeat([]byte("x"), schemas.BundleChunk)
	name := func(i int) string { return fmt.Sprintf("r1/work/nb/mine/b%d.bundle", i) }
	refused := 0
	var mu sync.Mutex
	for _, last := range []bool{false, true} {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				off := int64(0)
				if last {
					off = schemas.BundleChunk
				}
				if err := w.put(name(i), off, chunk, last); err != nil {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	obs, err := s.F.JetStream().ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	infos, _ := obs.List(ctx)
	var n uint64
	for _, in := range infos {
		n += in.Size
	}
	if n > 2*limit || refused == 0 {
		t.Errorf("node nb's bundles stored: %d bytes (room %d), %d chunks refused", n, 2*limit, refused)
	}
}
