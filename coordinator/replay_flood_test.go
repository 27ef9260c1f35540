package coordinator_test

import (
	"runtime"
	"strconv"
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

// A replay waiting for its reader's first answer held a sync subscription
// whose channel nats.go makes 65,536 messages long (512 KiB of heap,
// never written): the 64 replays one caller may leave waiting cost the
// coordinator 32 MiB, and the 1,024 of all callers together half a GiB,
// which its memory limit then collected against. Its flow control holds
// a few answers now. Not parallel: it measures the process's heap.
func TestFabricReplaysWaitingForAnAnswerCostLittleHeap(t *testing.T) {
	const (
		waiting   = 64 // greetingsPerCaller
		perReplay = 64 << 10
	)
	s := fabrictest.StartSecured(t)
	storeEvents(t, s, "watched", 1)
	mute := s.Connect(t, broker.RoleObserver, "mute")
	asked := make(chan struct{}, waiting)
	if _, err := mute.Subscribe(schemas.InboxPrefix("observer", "mute")+".>", func(m *nats.Msg) {
		if m.Header.Get(schemas.HeaderReplay) == "ack" {
			asked <- struct{}{} // and never answered
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := mute.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	before := heapMiB()
	for i := range waiting {
		inbox := schemas.InboxPrefix("observer", "mute") + ".r" + strconv.Itoa(i)
		if err := mute.PublishRequest(schemas.FabricSubject(schemas.VerbReplay), inbox, []byte(`{"agents":["watched"],"follow":true}`)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range waiting {
		select {
		case <-asked:
		case <-time.After(4 * time.Second):
			t.Fatalf("%d of %d replays asked their reader for a first answer within 4 s", i, waiting)
		}
	}
	if grew := heapMiB() - before; grew*(1<<20) > waiting*perReplay {
		t.Errorf("%d replays waiting for their reader's first answer hold %.1f MiB of the coordinator's heap, %.0f KiB each; want under %d KiB each",
			waiting, grew, grew*1024/waiting, perReplay>>10)
	}
}
