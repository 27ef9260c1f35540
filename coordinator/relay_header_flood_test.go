package coordinator_test

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node's share of the relay's work bounds what waits of its
// operations by their bytes, and counted only bodies: node evil, which
// answers no question of the relay's (so each of its hellos holds a place
// for a second), sent hellos whose 2 MB were all header, and held two
// gigabytes of the coordinator's heap where the same bytes as bodies held
// two hundred megabytes. Headers count. (Not parallel: it reads the
// process's heap.) What is held is the live heap, as the last collection
// found it: the heap in use also holds the garbage of every message sent
// and read, which a collector short of CPU under the race suite's load
// left at 400 – 555 MiB while 200 – 270 MiB was live. Each sample is
// taken after a collection. Under the race detector the flood is too
// slow to fill the heap, fixed or not (129 MiB live before the fix): the
// test script runs it again without it, where before the fix it held
// 1,044 MiB live, after it 190.
func TestRelayBoundsHeaderBytesOfAFlood(t *testing.T) {
	s := fabrictest.StartSecured(t)
	stall := s.Connect(t, broker.RoleNode, "evil")
	if _, err := stall.Subscribe(schemas.NodeGroup("evil")+".>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	stall.Flush()
	big := strings.Repeat("h", 2_000_000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 2 {
		nc := s.Dial(t, broker.RoleNode, "evil", nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
		inbox := nc.NewInbox()
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				m := nats.NewMsg(schemas.RelaySubject("evil", schemas.RelayHello))
				m.Reply = fmt.Sprintf("%s.%d.%d", inbox, c, i)
				m.Header.Set("X-Pad", big)
				nc.PublishMsg(m)
			}
		})
	}
	var peak uint64
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		// The live heap is what the last collection found: one now, or
		// a collector starved of CPU would leave it at its figure from
		// before the flood.
		runtime.GC()
		metrics.Read(live)
		peak = max(peak, live[0].Value.Uint64())
	}
	close(stop)
	wg.Wait()
	t.Logf("the live heap peaked at %d MiB", peak>>20)
	if peak > 512<<20 {
		t.Errorf("one node's hellos of 2 MB of header held %d MiB of the heap live; its share's bound is 64 MiB", peak>>20)
	}
}
