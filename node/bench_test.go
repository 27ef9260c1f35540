package node_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// replayBackend is an in-process backend that answers every turn by
// decoding a recorded claude transcript at full speed: the node's work
// from decoding to JetStream, without a CLI process in the way.
type replayBackend struct{ lines [][]byte }

func (r *replayBackend) Kind() string { return backend.BackendClaude }

func (r *replayBackend) Start(_ context.Context, spec backend.Spec, sink backend.Sink) (backend.Session, error) {
	return &replaySession{lines: r.lines, sink: sink}, nil
}

type replaySession struct {
	lines [][]byte
	sink  backend.Sink
}

func (s *replaySession) Prompt(context.Context, int, string) error {
	go func() {
		var d claude.Decoder
		var last schemas.Payload
		for _, l := range s.lines {
			for _, p := range d.Line(l, false) {
				if _, ok := p.(schemas.Result); ok {
					last = p // one result, at the end
					continue
				}
				s.sink.Emit(schemas.Event{Payload: p})
			}
		}
		s.sink.Emit(schemas.Event{Payload: last})
	}()
	return nil
}

func (s *replaySession) Interrupt(context.Context) (bool, error) { return false, nil }
func (s *replaySession) Close(context.Context) error {
	s.sink.Emit(schemas.Event{Payload: schemas.Status{Status: schemas.StatusDead}})
	return nil
}
func (s *replaySession) Info() backend.Info { return backend.Info{} }

func transcript(tb testing.TB, copies int) [][]byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/claude-stream-json.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	var lines [][]byte
	for range copies {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lines = append(lines, append([]byte(nil), sc.Bytes()...))
		}
	}
	return lines
}

// watchedAgent runs a node with be on srv, opens an agent of model on it,
// and returns what a benchmark drives it with: the node's context, the
// node, the open's reply, an observer connection and the agent's events
// as that observer sees them.
func watchedAgent(b *testing.B, srv *broker.Broker, be backend.Backend, model string, mutate ...func(*node.Config)) (context.Context, *node.Host, schemas.OpenReply, *nats.Conn, chan *nats.Msg) {
	b.Helper()
	cfg := node.Config{Name: "bench", Conn: natstest.Connect(b, srv), Dir: b.TempDir(), Backends: []backend.Backend{be}}
	for _, m := range mutate {
		m(&cfg)
	}
	h, err := node.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-h.Ready()
	rep, err := h.OpenAgent(ctx, schemas.OpenRequest{CWD: b.TempDir(), Model: model})
	if err != nil {
		b.Fatal(err)
	}
	obs := natstest.Connect(b, srv)
	msgs := make(chan *nats.Msg, 1<<16)
	sub, err := obs.ChanSubscribe(schemas.EventSubject(rep.AgentID), msgs)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sub.Unsubscribe() })
	if err := obs.Flush(); err != nil { // the server has the subscription before anything is published
		b.Fatal(err)
	}
	return ctx, h, rep, obs, msgs
}

// BenchmarkPipelineVsRawJetStream replays a recorded claude transcript
// through a node (decode, envelope, numbering, event log, the node's
// publisher: fast batches into a stream that allows them) and, in the same run, publishes the very payloads the
// node published with raw JetStream async publishes. Both are watched by
// the same kind of core subscriber, which is how each run sees its last
// event arrive. It reports both rates and their ratio (node/raw).
func BenchmarkPipelineVsRawJetStream(b *testing.B) {
	for _, journal := range []bool{true, false} {
		b.Run(fmt.Sprintf("journal=%v", journal), func(b *testing.B) {
			benchmarkPipeline(b, func(c *node.Config) { c.NoJournal = !journal })
		})
	}
}

func benchmarkPipeline(b *testing.B, mutate func(*node.Config)) {
	lines := transcript(b, 20)
	srv := natstest.Start(b)
	ctx, h, rep, obs, msgs := watchedAgent(b, srv, &replayBackend{lines: lines}, "", mutate)
	turn := func() []*nats.Msg {
		if _, err := h.Send(ctx, schemas.SendRequest{AgentID: rep.AgentID, Text: "go"}); err != nil {
			b.Fatal(err)
		}
		var got []*nats.Msg
		for m := range msgs {
			if bytes.HasPrefix(m.Data, []byte(`{"kind":"status","turn":0`)) {
				continue // the open's status idle, when the subscription saw it
			}
			got = append(got, m)
			if bytes.HasPrefix(m.Data, []byte(`{"kind":"result"`)) {
				return got
			}
		}
		return nil
	}
	sample := turn() // warm up, and capture what a turn publishes

	pubConn := natstest.Connect(b, srv)
	js, err := jetstream.New(pubConn, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		b.Fatal(err)
	}
	rawSeen := make(chan *nats.Msg, 1<<16)
	rawSub, err := obs.ChanSubscribe("agent.raw", rawSeen)
	if err != nil {
		b.Fatal(err)
	}
	defer rawSub.Unsubscribe()
	if err := obs.Flush(); err != nil {
		b.Fatal(err)
	}
	raw := func(round int) {
		for i, m := range sample {
			out := nats.NewMsg("agent.raw")
			out.Data = m.Data
			out.Header.Set(schemas.HeaderMsgID, fmt.Sprintf("raw.%d", round*len(sample)+i+1))
			if _, err := js.PublishMsgAsync(out); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("raw publishes not acknowledged")
		}
		for i := range sample {
			select {
			case <-rawSeen: // the same observer the node's events have
			case <-time.After(10 * time.Second):
				d, _ := rawSub.Dropped()
				b.Fatalf("round %d: the observer saw %d of %d raw events (dropped %d, last error %v)", round, i, len(sample), d, obs.LastError())
			}
		}
	}
	raw(0)

	var nodeTime, rawTime time.Duration
	events := 0
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		n := len(turn())
		nodeTime += time.Since(start)
		start = time.Now()
		raw(i + 1)
		rawTime += time.Since(start)
		events += n
	}
	b.StopTimer()
	nodeRate := float64(events) / nodeTime.Seconds()
	rawRate := float64(events) / rawTime.Seconds()
	b.ReportMetric(nodeRate, "node-events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(nodeRate/rawRate, "ratio")
}

// BenchmarkIdleAgentMemory reports what an idle claude agent costs its
// node: the Go heap plus goroutine stacks (runtime.MemStats HeapAlloc +
// StackInuse) per agent, for agents of the real claude backend driving
// the fake CLI, each idle after one turn. Not counted: the CLI processes,
// and the NATS server, which runs in a process of its own here. Each
// iteration opens a batch of agents and keeps them: a closed agent's
// goroutine stacks would be cached for the next ones and hide their cost.
func BenchmarkIdleAgentMemory(b *testing.B) {
	const batch = 16
	nc, err := nats.Connect(startBrokerProcess(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	h, err := node.New(node.Config{Name: "mem", Conn: nc, Dir: b.TempDir(), Backends: []backend.Backend{claude.New(fakeCLI("echo"))}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-h.Ready():
	case err := <-done:
		b.Fatalf("node did not start: %v", err)
	}
	cwd := b.TempDir()
	open := func() {
		for range batch {
			rep, err := h.OpenAgent(ctx, schemas.OpenRequest{CWD: cwd})
			if err != nil {
				b.Fatal(err)
			}
			if out, err := h.RunTurn(ctx, schemas.RunRequest{AgentID: rep.AgentID, Text: "hello"}); err != nil || out.Text != "echo: hello" {
				b.Fatalf("a turn: %+v %v", out, err)
			}
		}
	}
	measure := func() (heap, stack int64, goroutines int) {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC() // the second sweeps what the first freed, and empties sync.Pools
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc), int64(m.StackInuse), runtime.NumGoroutine()
	}
	open() // warm up: what the node allocates once is not per agent
	var heap, stack int64
	var goroutines int
	b.ResetTimer()
	for range b.N {
		heap0, stack0, g0 := measure()
		open()
		heap1, stack1, g1 := measure()
		heap += heap1 - heap0
		stack += stack1 - stack0
		goroutines += g1 - g0
	}
	b.StopTimer()
	n := float64(b.N * batch)
	b.ReportMetric(float64(heap)/n, "heap-bytes/agent")
	b.ReportMetric(float64(stack)/n, "stack-bytes/agent")
	b.ReportMetric(float64(heap+stack)/n, "bytes/agent")
	b.ReportMetric(float64(goroutines)/n, "goroutines/agent")
}
