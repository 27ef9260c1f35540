package bridge_test

import (
	"errors"
	"strings"
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
	t   *testing.T
	sub *nats.Subscription
}

func watchAPI(t *testing.T, nc *nats.Conn) *apiLog {
	t.Helper()
	sub, err := nc.SubscribeSync("$JS.API.>")
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	return &apiLog{t: t, sub: sub}
}

// take returns the requests seen since the last take. Every request the
// server handled before the flush was passed on ahead of its answer, so
// it is queued on the subscription once the flush returns: nothing is
// left to the time a handler would take to run (a sleep of 50 ms was,
// which a loaded machine can outlast, leaving a read to the next take).
func (l *apiLog) take(nc *nats.Conn) []string {
	l.t.Helper()
	if err := nc.Flush(); err != nil {
		l.t.Fatal(err)
	}
	var out []string
	for {
		m, err := l.sub.NextMsg(time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			l.t.Fatal(err)
		}
		out = append(out, m.Subject)
	}
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
