package bridge_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// subscribe dials a zmq4 SUB to address, prefix-subscribed to "agent:".
func subscribe(b *testing.B, ctx context.Context, address string) zmq4.Socket {
	b.Helper()
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(10*time.Millisecond), zmq4.WithDialerMaxRetries(500))
	if err := sub.Dial(address); err != nil {
		b.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "agent:"); err != nil {
		b.Fatal(err)
	}
	return sub
}

func receive(b *testing.B, sub zmq4.Socket, n int) {
	b.Helper()
	for i := range n {
		m, err := sub.Recv()
		if err != nil || len(m.Frames) != 2 {
			b.Fatalf("message %d: %v (%d frames)", i, err, len(m.Frames))
		}
	}
}

// BenchmarkBusVsRawZMQ moves a stored agent stream onto the Kaimon bus
// (durable JetStream consumer, Julia serialization, zmq4 PUB) to a zmq4
// SUB, and in the same run sends the same two-frame messages over raw zmq4
// PUB/SUB. It reports both rates and their ratio (bus/raw).
func BenchmarkBusVsRawZMQ(b *testing.B) {
	srv := natstest.Start(b)
	_, js := natstest.JetStream(b, srv)
	envs := fabrictest.TurnEnvelopes(b)
	const m = 5000
	var frames [][2][]byte
	for i := range m {
		env := envs[i%len(envs)]
		msg := nats.NewMsg("agent.bench")
		msg.Data = env
		msg.Header.Set(schemas.HeaderMsgID, fmt.Sprintf("bench.%d", i+1))
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
		frames = append(frames, [2][]byte{[]byte("agent:bench"), bridge.JuliaNamedTuple("agent:bench", string(env), "agent", bridge.DefaultJuliaVersion)})
	}
	<-js.PublishAsyncComplete()
	dir := b.TempDir()

	var busTime, rawTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Through the bus: a fresh durable replays the m stored events.
		b.StopTimer()
		ctx, cancel := context.WithCancel(b.Context())
		address := "ipc://" + filepath.Join(dir, fmt.Sprintf("bus-%d.sock", i))
		bus, err := bridge.NewBus(bridge.BusConfig{Conn: natstest.Connect(b, srv), Address: address,
			Durable: fmt.Sprintf("bench-%d", i), Replay: true, Grace: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- bus.Run(ctx, ready) }()
		sub := subscribe(b, ctx, address)
		b.StartTimer()
		<-ready
		start := time.Now()
		receive(b, sub, m)
		busTime += time.Since(start)
		b.StopTimer()
		sub.Close()
		cancel()
		<-done

		// Raw zmq4 PUB/SUB, the same frames.
		ctx, cancel = context.WithCancel(b.Context())
		rawAddress := "ipc://" + filepath.Join(dir, fmt.Sprintf("raw-%d.sock", i))
		pub := zmq4.NewPub(ctx)
		if err := pub.Listen(rawAddress); err != nil {
			b.Fatal(err)
		}
		sub = subscribe(b, ctx, rawAddress)
		for len(pub.(zmq4.Topics).Topics()) == 0 {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		start = time.Now()
		go func() {
			for _, f := range frames {
				pub.Send(zmq4.NewMsgFrom(f[0], f[1]))
			}
		}()
		receive(b, sub, m)
		rawTime += time.Since(start)
		b.StopTimer()
		sub.Close()
		pub.Close()
		cancel()
		b.StartTimer()
	}
	b.StopTimer()
	busRate := float64(m*b.N) / busTime.Seconds()
	rawRate := float64(m*b.N) / rawTime.Seconds()
	b.ReportMetric(busRate, "bus-events/s")
	b.ReportMetric(rawRate, "raw-zmq-events/s")
	b.ReportMetric(busRate/rawRate, "ratio")
}

// BenchmarkMCPStatusRoundTrip measures agent_status over MCP (Streamable
// HTTP, the official Go SDK client, a KV read and a request to the node),
// against a raw NATS request/reply to a responder on the same server in
// the same run.
func BenchmarkMCPStatusRoundTrip(b *testing.B) {
	mcpRoundTrip(b, "agent_status", map[string]any{"agent_id": "bench"}, schemas.VerbStatus)
}

// BenchmarkMCPSendRoundTrip measures agent_send over MCP the same way:
// validation, the record read that finds the agent's node, the request
// to it, the reply.
func BenchmarkMCPSendRoundTrip(b *testing.B) {
	mcpRoundTrip(b, "agent_send", map[string]any{"agent_id": "bench", "text": "hello"}, schemas.VerbSend)
}

// mcpRoundTrip calls tool over MCP, answered by a stand-in node that
// replies to verb from memory, and in the same loop makes a raw NATS
// request of a responder on the same server.
func mcpRoundTrip(b *testing.B, tool string, args map[string]any, verb schemas.Verb) {
	srv := natstest.Start(b)
	f, err := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	if err != nil {
		b.Fatal(err)
	}
	nc := natstest.Connect(b, srv)
	rec := schemas.AgentRecord{ID: "bench", Status: schemas.StatusIdle, Node: "bn", Model: "sonnet"}
	body := []byte(mustJSON(rec))
	reply := body
	if verb == schemas.VerbSend {
		reply = []byte(mustJSON(schemas.SendReply{Turn: 1}))
	}
	nc.Subscribe(schemas.ControlSubject("bn", verb), func(m *nats.Msg) { m.Respond(reply) })
	nc.Subscribe("bench.echo", func(m *nats.Msg) { m.Respond(reply) })
	nc.Flush()
	_, js := natstest.JetStream(b, srv)
	kv, _ := js.KeyValue(b.Context(), schemas.AgentsBucket)
	kv.Put(b.Context(), "bench", body)

	m := bridge.NewMCP(bridge.MCPConfig{Client: f})
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	urls := make(chan string, 1)
	go m.ListenHTTP(ctx, "127.0.0.1:0", bridge.HTTPConfig{}, func(u string) { urls <- u })
	url := <-urls
	client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	raw := natstest.Connect(b, srv)
	rawBody := []byte(mustJSON(args))

	var mcpTime, rawTime time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil || res.IsError {
			b.Fatalf("%s: %v %+v", tool, err, res)
		}
		mcpTime += time.Since(start)
		start = time.Now()
		if _, err := raw.Request("bench.echo", rawBody, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		rawTime += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(mcpTime.Microseconds())/float64(b.N), "mcp-µs/call")
	b.ReportMetric(float64(rawTime.Microseconds())/float64(b.N), "raw-nats-µs/request")
	b.ReportMetric(float64(mcpTime)/float64(rawTime), "ratio")
}
