package bridge_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// apiLog records the JetStream API requests made on a server: a KV read
// is one of them, and so is every bucket or stream lookup.
type apiLog struct {
	mu   sync.Mutex
	subj []string
}

func watchAPI(t *testing.T, nc *nats.Conn) *apiLog {
	t.Helper()
	l := &apiLog{}
	sub, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		l.mu.Lock()
		l.subj = append(l.subj, m.Subject)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	return l
}

// take returns the requests seen since the last take, once the server has
// had time to pass on any still in flight.
func (l *apiLog) take(nc *nats.Conn) []string {
	nc.Flush()
	time.Sleep(50 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.subj
	l.subj = nil
	return out
}

// recordReads counts the requests among subjs that read an agent record.
func recordReads(subjs []string) int {
	n := 0
	for _, s := range subjs {
		if strings.Contains(s, "KV_"+schemas.AgentsBucket) && (strings.Contains(s, ".DIRECT.GET.") || strings.Contains(s, ".MSG.GET.")) {
			n++
		}
	}
	return n
}

// An agent_send over MCP reads the agent's record once, to find its
// node, and opens no bucket or stream on the way: the client opens each
// once, when it first needs it.
func TestMCPSendReadsTheRecordOnce(t *testing.T) {
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	s := fb.client(nil)
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir()}, &opened)

	watch := natstest.Connect(t, fb.b)
	log := watchAPI(t, watch)
	for i := range 3 {
		log.take(watch)
		var sent schemas.SendReply
		ok(t, s, "agent_send", map[string]any{"agent_id": opened.AgentID, "text": "hello"}, &sent)
		if sent.Turn != i+1 {
			t.Fatalf("send %d answered turn %d", i+1, sent.Turn)
		}
		// The node's own writes (the record's turn, its events) are
		// JetStream publishes, not API requests; reads are.
		seen := log.take(watch)
		if n := recordReads(seen); n != 1 {
			t.Fatalf("send %d read the agent record %d times; API requests:\n%s", i+1, n, strings.Join(seen, "\n"))
		}
		if i == 0 {
			continue // the client's first read of the bucket opens it
		}
		for _, subj := range seen {
			if strings.Contains(subj, ".INFO.") || strings.Contains(subj, ".NAMES") || strings.Contains(subj, ".LIST") {
				t.Fatalf("send %d looked up a bucket or stream (%s); API requests:\n%s", i+1, subj, strings.Join(seen, "\n"))
			}
		}
	}
}
