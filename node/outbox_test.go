package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// The coordinator goes away while an agent streams: the node's outbox
// fills, the turn is interrupted rather than events dropped silently, and
// once the coordinator is back the stream holds the whole turn, numbered
// without a gap, and says what happened.
func TestOutboxFullInterruptsAndSaysSo(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	b := natstest.Start(t, func(c *broker.Config) { c.StoreDir = store })
	url := b.ClientURL()
	nc, err := nats.Connect(url, nats.ReconnectBufSize(-1), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	h, err := node.New(node.Config{Name: "n1", Conn: nc, Dir: t.TempDir(), OutboxMemory: 48 << 10, OutboxDisk: -1,
		Backends: []backend.Backend{claude.New(fakeCLI("chatty"))}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-h.Ready()
	rep, err := h.OpenAgent(t.Context(), schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	live, err := natstest.Connect(t, b).SubscribeSync(schemas.EventSubject(rep.AgentID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Send(t.Context(), schemas.SendRequest{AgentID: rep.AgentID, Text: "talk"}); err != nil {
		t.Fatal(err)
	}
	// Let it stream, then take the coordinator away.
	poll.Until(t, 30*time.Second, "the turn streams", func() bool {
		m, err := live.NextMsg(time.Second)
		return err == nil && strings.Contains(string(m.Data), "chatter")
	})
	b.Shutdown()
	poll.Until(t, 60*time.Second, "the turn is interrupted", func() bool {
		r, err := h.AgentStatus(t.Context(), schemas.AgentRequest{AgentID: rep.AgentID})
		return err == nil && r.Status == schemas.StatusIdle
	})
	// The coordinator comes back on the same port and store.
	port := url[strings.LastIndexByte(url, ':')+1:]
	b2 := natstest.Start(t, func(c *broker.Config) { c.StoreDir = store; c.Port = atoi(port) })
	g := &fixture{t: t, b: b2}
	g.fabric, err = newFabric(t, b2)
	if err != nil {
		t.Fatal(err)
	}
	g.js = g.fabric.JetStream()
	w := g.watch(rep.AgentID) // checks the numbering has no gap
	i := w.until(0, "the notice", func(ev schemas.Event) bool {
		e, ok := ev.Payload.(schemas.Error)
		return ok && strings.Contains(e.Message, "outbox filled")
	})
	e := w.events()[i].Payload.(schemas.Error)
	if !strings.Contains(e.Message, "outbox filled (48 KiB in memory)") || !strings.Contains(e.Message, "turn 1 was interrupted") {
		t.Errorf("notice: %s", e.Message)
	}
	j := w.until(0, "the result", isResult(1))
	if r := w.events()[j].Payload.(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("the turn ended %s", r.StopReason)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// A CLI printing faster than the stream stores is held at its pipe while
// the coordinator is there: the node's outbox stays near its ahead (half
// of a 256 KiB memory tier here) instead of reading the CLI into memory
// and onto disk, and every event is stored, numbered without a gap. The
// node publishes one event at a time (a window of 1) so the stream is
// the slower.
func TestNodeHoldsACLIAheadOfTheStream(t *testing.T) {
	t.Parallel()
	printed := filepath.Join(t.TempDir(), "printed")
	f := startNode(t, fixtureOptions{claude: fakeCLI("firehose", "SHOAL_FAKE_PRINTED="+printed), node: func(c *node.Config) {
		c.OutboxMemory = 256 << 10
		c.PublishWindow = 1
	}})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "go")
	count := func() int {
		b, _ := os.ReadFile(printed)
		return atoi(strings.TrimSpace(string(b)))
	}
	// A firehose event's message is about 260 bytes with the outbox's
	// bookkeeping: ahead is past some 500 of them.
	deepest := 0
	// One event in flight at a time: 20,000 round trips, 16 s under the
	// race detector alone, past a minute on a machine loaded with other
	// tests.
	poll.Until(t, 4*time.Minute, "the CLI prints 20,000 deltas", func() bool {
		deepest = max(deepest, f.host.OutboxDepth())
		return count() >= 20_000
	})
	for range 200 {
		deepest = max(deepest, f.host.OutboxDepth())
		time.Sleep(time.Millisecond)
	}
	if deepest > 1_000 || deepest == 0 {
		t.Errorf("the outbox held up to %d events while the CLI printed %d: not held at its pipe", deepest, count())
	}
	if _, err := f.fabric.Interrupt(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Fatal(err)
	}
	i := w.until(0, "the result", isResult(1))
	deltas := 0
	for _, ev := range w.events()[:i] {
		if ev.IsDelta() {
			deltas++
		}
	}
	if n := count(); deltas < n-1 || deltas > n {
		t.Errorf("%d deltas stored, the CLI printed %d", deltas, n)
	}
}
