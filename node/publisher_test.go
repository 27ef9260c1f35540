package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// flakyJS fails some publishes: some before they leave, some after the
// server stored them (the ack is lost), as a network would.
type flakyJS struct {
	jetstream.JetStream
	mu    sync.Mutex
	n     int
	fails int
}

var errFlaky = errors.New("injected failure")

func (f *flakyJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	switch {
	case n%7 == 0:
		f.count()
		return nil, errFlaky // never sent
	case n%11 == 0:
		f.count()
		// Sent and stored, but the ack never arrives.
		if _, err := f.JetStream.PublishMsgAsync(m, opts...); err != nil {
			return nil, err
		}
		return failedFuture{msg: m, err: errFlaky}, nil
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

func (f *flakyJS) count() {
	f.mu.Lock()
	f.fails++
	f.mu.Unlock()
}

// Failed publishes are retried from the failure on, under the same ids:
// the stream ends up with every event once, in order.
func TestPublisherRetriesLoseAndDoubleNothing(t *testing.T) {
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	flaky := &flakyJS{JetStream: js}
	p := newPublisher(flaky, 16, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	const n = 200
	for _, id := range []string{"a", "b"} {
		for i := uint64(1); i <= n; i++ {
			p.enqueue(&outMsg{agent: id, seq: i, msg: eventMsg("n", id, i, []byte(fmt.Sprintf(`{"n":%d}`, i)), time.Now())})
		}
	}
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	defer fcancel()
	if err := p.flush(fctx); err != nil {
		t.Fatalf("flush: %v (pending %d)", err, p.pending())
	}
	if flaky.fails == 0 {
		t.Fatal("no failure was injected")
	}
	s, _ := js.Stream(ctx, schemas.StreamName)
	for _, id := range []string{"a", "b"} {
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
		if err != nil {
			t.Fatal(err)
		}
		for want := uint64(1); want <= n; want++ {
			m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatalf("agent %s: event %d missing: %v", id, want, err)
			}
			if _, got, _ := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID)); got != want {
				t.Fatalf("agent %s: event %d where %d belongs", id, got, want)
			}
		}
		if _, err := cons.Next(jetstream.FetchMaxWait(200 * time.Millisecond)); err == nil {
			t.Fatalf("agent %s: more than %d events stored", id, n)
		}
	}
}
