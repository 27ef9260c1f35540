package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkOpenThroughPlacement measures agent_open through placement (a
// cached view of the nodes, the choice, the request to the node, its
// claim of the id in KV and its first events), without any CLI start-up,
// with 1, 10 and 100 registered nodes. One node is real; the others are
// records placement must consider: two in five fit the request too (the
// least-loaded sort ranks them, and they are far busier than the real
// node), the rest are passed over for a label, the model or their limit.
//
// The records are written once, so the broker's node TTL is an hour: under
// the test default of 2s they would expire during a longer -benchtime and
// the benchmark would measure fewer nodes. Before and after the timed
// loop, placement is asked for what nothing fits, and its error must name
// every registered node; and a fake node that should fit, named, must get
// past placement.
func BenchmarkOpenThroughPlacement(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			srv := natstest.Start(b, func(c *broker.Config) { c.Assets.NodeTTL = time.Hour })
			fabrictest.Node(b, srv, node.Config{Name: "real", MaxDead: 1 << 20,
				Labels: map[string]string{"pool": "bench"}, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
			ctx := b.Context()
			_, js := natstest.JetStream(b, srv)
			kv, err := js.KeyValue(ctx, schemas.NodesBucket)
			if err != nil {
				b.Fatal(err)
			}
			for i := 1; i < n; i++ {
				v, _ := json.Marshal(fakeNode(i))
				if _, err := kv.Put(ctx, fmt.Sprintf("other-%03d", i), v); err != nil {
					b.Fatal(err)
				}
			}
			f, err := client.NewDirect(natstest.Connect(b, srv), client.Config{})
			if err != nil {
				b.Fatal(err)
			}
			if err := f.WatchNodes(ctx); err != nil {
				b.Fatal(err)
			}
			placementSees(b, ctx, f, n)
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
			placementSees(b, ctx, f, n)
			b.ReportMetric(float64(openTime.Microseconds())/float64(b.N)/1000, "ms/open")
			b.ReportMetric(float64(rawTime.Microseconds())/float64(b.N)/1000, "raw-nats-ms/request")
			b.ReportMetric(float64(openTime)/float64(rawTime), "ratio")
		})
	}
}

// fakeNode is the record of registered node i (from 1), which never runs
// an agent: by i mod 5, one that fits the benchmark's request but is
// about a million agents busier than the real node (1, 3), one with
// another pool label (2), one without claude (4) and a full one (0).
func fakeNode(i int) schemas.NodeRecord {
	rec := schemas.NodeRecord{Name: fmt.Sprintf("other-%03d", i), Labels: map[string]string{"pool": "bench"},
		Backends: []schemas.BackendInfo{{Kind: "claude", Ready: true}}, Heartbeat: float64(time.Now().Unix())}
	switch i % 5 {
	case 1, 3:
		// Busier than the real node can become: its load is agents/1000
		// too, and the benchmark opens far fewer than a billion agents.
		rec.Agents = 1_000_000 + i
	case 2:
		rec.Labels["pool"] = "elsewhere"
	case 4:
		rec.Backends = []schemas.BackendInfo{{Kind: "ollama", Ready: true, Models: []string{"qwen3:8b"}}}
	case 0:
		rec.Agents, rec.MaxAgents = 4, 4
	}
	return rec
}

// placementSees fails the benchmark unless placement considers exactly
// want nodes: asked for a label no node has, it must refuse and give a
// reason for each of them, the real one included.
func placementSees(b *testing.B, ctx context.Context, f *client.Direct, want int) {
	b.Helper()
	nodes, err := f.Nodes(ctx)
	if err != nil || len(nodes) != want {
		b.Fatalf("the fabric lists %d nodes, want %d (%v)", len(nodes), want, err)
	}
	_, err = f.Open(ctx, schemas.OpenRequest{CWD: b.TempDir(), Labels: map[string]string{"pool": "nowhere"}})
	list, ok := strings.CutPrefix(fmt.Sprint(err), "no node can take this agent (")
	if !ok {
		b.Fatalf("an open nothing fits: %v", err)
	}
	reasons := strings.Split(strings.TrimSuffix(list, ")"), "; ")
	if len(reasons) != want || !strings.Contains(list, "real: has pool=bench, not nowhere") {
		b.Fatalf("placement considered %d nodes, want %d: %v", len(reasons), want, err)
	}
	for i := 1; i < want; i++ {
		if !strings.Contains(list, fmt.Sprintf("other-%03d: ", i)) {
			b.Fatalf("placement did not consider other-%03d: %v", i, err)
		}
	}
	if want > 1 {
		// other-001 fits the request: named, placement lets it through
		// and only the missing node process refuses.
		_, err := f.Open(ctx, schemas.OpenRequest{CWD: b.TempDir(), Node: "other-001", Labels: map[string]string{"pool": "bench"}})
		if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(fmt.Sprint(err), "node other-001 is not reachable") {
			b.Fatalf("other-001 does not fit the benchmark's request: %v", err)
		}
	}
}
