package coordinator_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A send the fabric service holds for a node that answers nothing (its
// process stopped with SIGSTOP: its subscriptions stand, so no "no
// responders" comes back) cost the coordinator about 530 KB of heap: its
// request to the node waited on a sync subscription, whose channel nats.go
// makes 65,536 messages long (512 KiB of pointers) though one reply comes.
// Two thousand held sends took the coordinator's heap to 1 GiB (its RSS
// stayed small: the channels were never written). A held request costs a
// few KB (7 when this was written), the embedded server's share of it
// included; the service runs at most DefaultMaxHeld at once (nothing
// bounded them), refusing one more at once, saying so; and every one held
// is answered once the node answers. (Not parallel: it reads the
// process's heap.)
func TestHeldSendsCostTheCoordinatorLittleHeap(t *testing.T) {
	const (
		held    = coordinator.DefaultMaxHeld // the most the service runs at once
		over    = 16                         // sent past them, refused at once
		perHeld = 32 << 10                   // bytes of heap one held request may cost
	)
	s := fabrictest.StartSecured(t)
	madeAgents(t, s, 1, func(int) string { return "a1" })

	// n1 takes every send and answers none, until told to.
	var (
		mu      sync.Mutex
		replyTo []string
	)
	node := s.Connect(t, broker.RoleNode, "n1")
	if _, err := node.Subscribe(schemas.ControlSubject("n1", schemas.VerbSend), func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		replyTo = append(replyTo, m.Reply)
	}); err != nil {
		t.Fatal(err)
	}
	if err := node.Flush(); err != nil {
		t.Fatal(err)
	}
	taken := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(replyTo)
	}

	// The caller sends as client.Remote does, keepalive asked for, from
	// one subscription of its own: what the test holds is the
	// coordinator's.
	caller := s.Connect(t, broker.RoleClient, "sender")
	inbox := schemas.InboxPrefix(string(broker.RoleClient), "sender") + ".held"
	var answered, refused atomic.Int64
	if _, err := caller.Subscribe(inbox+".*", func(m *nats.Msg) {
		switch {
		case m.Header.Get(schemas.HeaderKeepalive) != "":
		case strings.Contains(string(m.Data), "the coordinator has 4096 requests under way, the most it runs at once"):
			refused.Add(1)
		default:
			answered.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := caller.Flush(); err != nil {
		t.Fatal(err)
	}

	before := heapMiB()
	for i := range held + over {
		m := &nats.Msg{
			Subject: schemas.FabricSubject(schemas.VerbSend),
			Reply:   inbox + "." + strconv.Itoa(i),
			Header:  nats.Header{schemas.HeaderKeepalive: {"5000"}},
			Data:    fmt.Appendf(nil, `{"agent_id":"a1","text":"turn %d","request_id":"held-%d"}`, i, i),
		}
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 45*time.Second, fmt.Sprintf("the node to be asked all %d sends", held), func() bool { return taken() >= held })
	grew := int64((heapMiB() - before) * (1 << 20))
	if each := grew / held; each > perHeld {
		t.Errorf("%d held sends hold %.1f MiB of heap, %d KB each; want under %d KB each", held, float64(grew)/(1<<20), each>>10, perHeld>>10)
	} else {
		t.Logf("%d held sends hold %.1f MiB of heap, %d KB each", held, float64(grew)/(1<<20), each>>10)
	}
	if n := answered.Load(); n != 0 {
		t.Fatalf("%d of the sends were answered while the node answered none", n)
	}
	poll.Until(t, 10*time.Second, fmt.Sprintf("the %d sends past the bound to be refused", over), func() bool { return refused.Load() >= over })
	if n := taken(); n != held {
		t.Errorf("the node was asked %d sends; the service runs %d at once", n, held)
	}

	// The node answers: so does the coordinator, every send.
	mu.Lock()
	for _, to := range replyTo {
		node.Publish(to, []byte(`{"turn":1}`))
	}
	mu.Unlock()
	poll.Until(t, 45*time.Second, fmt.Sprintf("all %d held sends to be answered once the node answered", held), func() bool { return answered.Load() >= held })
}
