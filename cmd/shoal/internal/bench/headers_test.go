package bench

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkEventHeaders measures what an event's headers cost the stream,
// in one run on an embedded server: the same text delta envelope stored
// in fast batches (the node's way of publishing) under the node's three
// headers, under its message id alone, and under none. Each round
// publishes 20,000 events each way, to an agent subject of its own, in a
// different order each round. It reports each way's events/s, their
// ratios, and each way's bytes per message on the wire.
func BenchmarkEventHeaders(b *testing.B) {
	br, err := embedded(b.Context(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer br.Shutdown()
	nc, err := nats.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// A stand-in's delta, as the node stores it.
	env, err := json.Marshal(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Delta: true,
		Content: schemas.ContentBlock{Type: "text", Text: "s12345t1764900000123456789 "}}})
	if err != nil {
		b.Fatal(err)
	}
	type way struct {
		name    string
		headers func(m *nats.Msg, id string, n int)
	}
	ways := []way{
		{"three", func(m *nats.Msg, id string, n int) {
			m.Header[schemas.HeaderMsgID] = []string{schemas.MsgID(id, uint64(n))}
			m.Header[schemas.HeaderNode] = []string{"bench-node-1"}
			m.Header[schemas.HeaderTime] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
		}},
		{"msgid", func(m *nats.Msg, id string, n int) {
			m.Header[schemas.HeaderMsgID] = []string{schemas.MsgID(id, uint64(n))}
		}},
		{"none", func(*nats.Msg, string, int) {}},
	}
	const per = 20000
	took := make([]time.Duration, len(ways))
	wire := make([]int, len(ways))
	b.ResetTimer()
	for i := range b.N {
		for k := range ways {
			w := (i + k) % len(ways)
			id := fmt.Sprintf("hdr-%s-%d", ways[w].name, i)
			fb, err := newFastBatch(js)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for n := 1; n <= per; n++ {
				m := nats.NewMsg(schemas.EventSubject(id))
				m.Data = env
				ways[w].headers(m, id, n)
				if n == 1 {
					wire[w] = len(m.Data) + headerBytes(m.Header)
				}
				if err := fb.add(m); err != nil {
					b.Fatal(err)
				}
			}
			if err := fb.end(b.Context()); err != nil {
				b.Fatalf("%s: %v", ways[w].name, err)
			}
			took[w] += time.Since(start)
		}
	}
	b.StopTimer()
	rate := make([]float64, len(ways))
	for w := range ways {
		rate[w] = float64(per*b.N) / took[w].Seconds()
		b.ReportMetric(rate[w], ways[w].name+"-events/s")
		b.ReportMetric(float64(wire[w]), ways[w].name+"-bytes/msg")
	}
	b.ReportMetric(rate[0]/rate[1], "three/msgid")
	b.ReportMetric(rate[1]/rate[2], "msgid/none")
	b.ReportMetric(rate[0]/rate[2], "three/none")
	b.ReportMetric(0, "ns/op")
}

// headerBytes is the size of h's block on the wire: NATS/1.0, a line per
// value, and the empty line; none when there is no header.
func headerBytes(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}
