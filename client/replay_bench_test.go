package client_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// BenchmarkReplayVsOrderedConsumer replays one agent's stored events
// through Fabric.Replay (reading each one's number, kind, turn and delta,
// checking the number for gaps), both as a read of what is stored (a pull
// consumer deleted after the read) and as a following replay catching up
// (an ordered consumer, as the baseline), and, in the same run, reads the
// same messages with a raw JetStream ordered consumer. It reports the
// rates and their ratios to the raw rate.
func BenchmarkReplayVsOrderedConsumer(b *testing.B) {
	srv := natstest.Start(b)
	_, js := natstest.JetStream(b, srv)
	envs := fabrictest.TurnEnvelopes(b)
	const m = 10000
	for i := range m {
		msg := nats.NewMsg("agent.replay")
		msg.Data = envs[i%len(envs)]
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID("replay", uint64(i+1)))
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
		if i%5 == 0 {
			other := nats.NewMsg("agent.other")
			other.Data = envs[i%len(envs)]
			js.PublishMsgAsync(other)
		}
	}
	<-js.PublishAsyncComplete()
	f, _ := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	stream, _ := js.Stream(b.Context(), schemas.StreamName)

	var replayTime, followTime, rawTime time.Duration
	errCaughtUp := errors.New("caught up")
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		n := 0
		err := f.Replay(b.Context(), []string{"replay"}, client.From{}, false, func(r client.Replayed, g *client.Gap) error {
			if g != nil {
				return fmt.Errorf("gap %v", g)
			}
			n++
			return nil
		})
		if err != nil || n != m {
			b.Fatalf("replayed %d of %d: %v", n, m, err)
		}
		replayTime += time.Since(start)

		start = time.Now()
		n = 0
		err = f.Replay(b.Context(), []string{"replay"}, client.From{}, true, func(r client.Replayed, g *client.Gap) error {
			if g != nil {
				return fmt.Errorf("gap %v", g)
			}
			if n++; n == m {
				return errCaughtUp
			}
			return nil
		})
		if !errors.Is(err, errCaughtUp) {
			b.Fatalf("a following replay caught up %d of %d: %v", n, m, err)
		}
		followTime += time.Since(start)

		start = time.Now()
		cons, err := stream.OrderedConsumer(b.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{"agent.replay"}})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		for range m {
			if _, err := it.Next(); err != nil {
				b.Fatal(err)
			}
		}
		it.Stop()
		rawTime += time.Since(start)
	}
	b.StopTimer()
	replayRate := float64(m*b.N) / replayTime.Seconds()
	rawRate := float64(m*b.N) / rawTime.Seconds()
	followRate := float64(m*b.N) / followTime.Seconds()
	b.ReportMetric(replayRate, "replay-events/s")
	b.ReportMetric(followRate, "follow-events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(replayRate/rawRate, "ratio")
	b.ReportMetric(followRate/rawRate, "follow-ratio")
}

// BenchmarkReplaySeam measures the seam between history and live: a
// following replay has caught up, an event is published, and the time
// until the replay delivers it, against the same publish-to-delivery with
// a raw core subscription in the same run.
func BenchmarkReplaySeam(b *testing.B) {
	srv := natstest.Start(b)
	_, js := natstest.JetStream(b, srv)
	for i := range 1000 {
		msg := nats.NewMsg("agent.seam")
		msg.Data = []byte(`{"kind":"turn_started","turn":1,"data":{}}`)
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID("seam", uint64(i+1)))
		js.PublishMsg(b.Context(), msg)
	}
	f, _ := client.NewDirect(natstest.Connect(b, srv), client.Config{})
	got := make(chan uint64, 1)
	go f.Replay(b.Context(), []string{"seam"}, client.From{}, true, func(r client.Replayed, _ *client.Gap) error {
		if r.N > 1000 {
			got <- r.N
		}
		return nil
	})
	raw := natstest.Connect(b, srv)
	rawGot := make(chan struct{}, 1)
	raw.Subscribe("agent.seam", func(*nats.Msg) {
		select {
		case rawGot <- struct{}{}:
		default:
		}
	})
	raw.Flush()
	pub := natstest.Connect(b, srv)
	pjs, _ := jetstream.New(pub)
	n := uint64(1000)
	var seam, rawLatency time.Duration
	b.ResetTimer()
	for range b.N {
		n++
		msg := nats.NewMsg("agent.seam")
		msg.Data = []byte(`{"kind":"turn_started","turn":1,"data":{}}`)
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID("seam", n))
		for len(rawGot) > 0 {
			<-rawGot
		}
		start := time.Now()
		if _, err := pjs.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
		<-rawGot
		rawLatency += time.Since(start)
		if got := <-got; got != n {
			b.Fatalf("delivered %d, want %d", got, n)
		}
		seam += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(seam.Microseconds())/float64(b.N), "seam-µs")
	b.ReportMetric(float64(rawLatency.Microseconds())/float64(b.N), "raw-sub-µs")
	b.ReportMetric(float64(seam)/float64(rawLatency), "ratio")
}
