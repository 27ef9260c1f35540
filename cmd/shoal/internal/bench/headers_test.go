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

// BenchmarkEventHeaders measures what an event's headers cost the
// server, in one run on an embedded server: the same text delta envelope
// stored in fast batches (the node's way of publishing) under the node's
// three headers, under its message id alone, under a header of the same
// size that is not a message id, and under none. The messages are made
// before the clock starts, so what is timed is sending and storing them.
// Each round publishes 20,000 events each way, to an agent subject of its
// own, in a different order each round. It reports each way's events/s,
// their ratios, and each way's header and envelope bytes per message.
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
	stamp := time.Now().UTC().Format(time.RFC3339Nano)
	type way struct {
		name    string
		headers func(h nats.Header, id string, n int)
	}
	ways := []way{
		{"three", func(h nats.Header, id string, n int) {
			h[schemas.HeaderMsgID] = []string{schemas.MsgID(id, uint64(n))}
			h[schemas.HeaderNode] = []string{"bench-node-1"}
			h[schemas.HeaderTime] = []string{stamp}
		}},
		{"msgid", func(h nats.Header, id string, n int) {
			h[schemas.HeaderMsgID] = []string{schemas.MsgID(id, uint64(n))}
		}},
		// As many bytes as the message id's, under a name the server
		// keeps nothing for.
		{"other", func(h nats.Header, id string, n int) {
			h["Shoal-Nats-Id"] = []string{schemas.MsgID(id, uint64(n))}
		}},
		{"none", func(nats.Header, string, int) {}},
	}
	const per = 20000
	took := make([]time.Duration, len(ways))
	wire := make([]int, len(ways))
	b.ResetTimer()
	for i := range b.N {
		for k := range ways {
			w := (i + k) % len(ways)
			id := fmt.Sprintf("hdr-%s-%d", ways[w].name, i)
			b.StopTimer()
			msgs := make([]*nats.Msg, per)
			for n := range msgs {
				m := nats.NewMsg(schemas.EventSubject(id))
				m.Data = env
				ways[w].headers(m.Header, id, n+1)
				msgs[n] = m
			}
			wire[w] = len(env) + headerBytes(msgs[0].Header)
			fb, err := newFastBatch(js)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			for _, m := range msgs {
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
	rate := map[string]float64{}
	for w := range ways {
		rate[ways[w].name] = float64(per*b.N) / took[w].Seconds()
		b.ReportMetric(rate[ways[w].name], ways[w].name+"-events/s")
		b.ReportMetric(float64(wire[w]), ways[w].name+"-bytes/msg")
	}
	b.ReportMetric(rate["other"]/rate["none"], "other/none")
	b.ReportMetric(rate["msgid"]/rate["other"], "msgid/other")
	b.ReportMetric(rate["three"]/rate["msgid"], "three/msgid")
	b.ReportMetric(rate["three"]/rate["none"], "three/none")
	b.ReportMetric(0, "ns/op")
}

// headerBytes is the size of h's block in a message: NATS/1.0, a line per
// value, and the empty line; none when there is no header. (The subject
// and the protocol line come on top, the same for every way.)
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
