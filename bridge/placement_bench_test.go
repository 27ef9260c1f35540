package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// instantBackend starts agents with no process, so an open measures the
// fabric and not a CLI's start-up.
type instantBackend struct{}

func (instantBackend) Kind() string { return backend.KindClaude }

func (instantBackend) Start(_ context.Context, _ backend.Spec, sink backend.Sink) (backend.Session, error) {
	return &instantSession{sink: sink}, nil
}

type instantSession struct{ sink backend.Sink }

func (*instantSession) Send(context.Context, string) (int, error) { return 1, nil }
func (*instantSession) Interrupt(context.Context) (bool, error)   { return false, nil }
func (*instantSession) Info() backend.Info                        { return backend.Info{} }
func (s *instantSession) Close(context.Context) error {
	s.sink.Emit(schemas.Event{Payload: schemas.Status{Status: schemas.StatusDead}})
	return nil
}

// BenchmarkOpenThroughPlacement measures agent_open through placement (a
// cached view of the nodes, the choice, the request to the node, its
// claim of the id in KV and its first events), without any CLI start-up,
// with 1, 10 and 100 registered nodes. One node is real; the others are
// records that placement must consider and pass over.
func BenchmarkOpenThroughPlacement(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			srv := natstest.Start(b)
			h, err := node.New(node.Config{Name: "real", Conn: natstest.Connect(b, srv), Dir: b.TempDir(), MaxDead: 1 << 20,
				Labels: map[string]string{"pool": "bench"}, Backends: []backend.Backend{instantBackend{}}})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			go h.Run(ctx)
			<-h.Ready()
			_, js := natstest.JetStream(b, srv)
			kv, _ := js.KeyValue(ctx, schemas.NodesBucket)
			for i := 1; i < n; i++ {
				rec := schemas.NodeRecord{Name: fmt.Sprintf("other-%03d", i), Labels: map[string]string{"pool": "elsewhere"},
					Backends: []schemas.BackendInfo{{Kind: "claude", Ready: true}}, Heartbeat: float64(time.Now().Unix())}
				v, _ := json.Marshal(rec)
				kv.Put(ctx, rec.Name, v)
			}
			f, err := bridge.NewFabric(natstest.Connect(b, srv), bridge.FabricConfig{})
			if err != nil {
				b.Fatal(err)
			}
			if err := f.WatchNodes(ctx); err != nil {
				b.Fatal(err)
			}
			echo := natstest.Connect(b, srv)
			echo.Subscribe("bench.echo", func(m *nats.Msg) { m.Respond(m.Data) })
			echo.Flush()
			raw := natstest.Connect(b, srv)
			cwd := b.TempDir()
			req := schemas.OpenRequest{CWD: cwd, Labels: map[string]string{"pool": "bench"}}
			body, _ := json.Marshal(req)
			var openTime, rawTime time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				rep, err := f.Open(ctx, req)
				if err != nil || rep.Node != "real" {
					b.Fatalf("open: %+v %v", rep, err)
				}
				openTime += time.Since(start)
				start = time.Now()
				if _, err := raw.Request("bench.echo", body, 5*time.Second); err != nil {
					b.Fatal(err)
				}
				rawTime += time.Since(start)
			}
			b.StopTimer()
			b.ReportMetric(float64(openTime.Microseconds())/float64(b.N)/1000, "ms/open")
			b.ReportMetric(float64(rawTime.Microseconds())/float64(b.N)/1000, "raw-nats-ms/request")
			b.ReportMetric(float64(openTime)/float64(rawTime), "ratio")
		})
	}
}
