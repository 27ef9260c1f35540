package coordinator_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// heapMiB is the test process's live heap (the coordinator's, here),
// after a collection.
func heapMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// A replay's reader learns the subject its answers go to, and may publish
// anything under it: the coordinator held all it sent until the next
// ask (nats.go's 64 MiB a subscription by default), for each of the
// replays the bounds let it have. What a replay's flow control holds
// unread is a few small messages now; a reader that sends more loses its
// replay. Not parallel: it measures the process's heap.
func TestFabricReplayHoldsNoFloodOfItsReadersAnswers(t *testing.T) {
	s := fabrictest.StartSecured(t)
	storeEvents(t, s, "watched", 1)
	eve := s.Connect(t, broker.RoleObserver, "eve")
	inbox := schemas.InboxPrefix("observer", "eve") + ".r1"
	acks := make(chan string, 16)
	if _, err := eve.Subscribe(inbox, func(m *nats.Msg) {
		if m.Header.Get(schemas.HeaderReplay) == "ack" {
			eve.Publish(m.Reply, nil)
			acks <- m.Reply
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := eve.PublishRequest(schemas.FabricSubject(schemas.VerbReplay), inbox, []byte(`{"agents":["watched"],"follow":true}`)); err != nil {
		t.Fatal(err)
	}
	var first string
	select {
	case first = <-acks:
	case <-time.After(30 * time.Second):
		t.Fatal("the replay asked for no answer")
	}
	prefix := first[:strings.LastIndexByte(first, '.')]
	time.Sleep(200 * time.Millisecond)
	before := heapMiB()
	junk := make([]byte, 1<<20)
	for range 48 {
		if err := eve.Publish(prefix+".junk", junk); err != nil {
			t.Fatal(err)
		}
	}
	if err := eve.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if grew := heapMiB() - before; grew > 16 {
		t.Errorf("48 MiB published to a replay's answers (%s.junk) made the coordinator hold %.0f MiB more", prefix, grew)
	}
}
