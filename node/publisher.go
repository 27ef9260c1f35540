package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// outMsg is one event waiting to be stored.
type outMsg struct {
	agent string
	seq   uint64
	msg   *nats.Msg
}

// publisher stores events in the AGENTS stream in the order they were
// produced, asynchronously, with a bounded window of unacknowledged
// messages. A failed publish is retried under the same Nats-Msg-Id from the
// failed message on (go-back-N), so nothing is lost and JetStream's
// duplicate window drops what was stored already; before a retry it asks
// the stream for each agent's last stored event number, so a retry after
// a long outage doubles nothing either. Producers never wait for it.
type publisher struct {
	js     jetstream.JetStream
	window int
	log    *slog.Logger

	mu      sync.Mutex
	queue   []*outMsg
	wake    chan struct{}
	drained chan struct{} // closed and replaced whenever the queue empties
}

func newPublisher(js jetstream.JetStream, window int, log *slog.Logger) *publisher {
	return &publisher{js: js, window: window, log: log, wake: make(chan struct{}, 1), drained: make(chan struct{})}
}

// enqueue adds a message; it never blocks on the network.
func (p *publisher) enqueue(m *outMsg) {
	p.mu.Lock()
	p.queue = append(p.queue, m)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pending is how many events wait to be stored.
func (p *publisher) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// flush waits until every event enqueued so far is stored, or ctx ends.
func (p *publisher) flush(ctx context.Context) error {
	for {
		p.mu.Lock()
		empty, drained := len(p.queue) == 0, p.drained
		p.mu.Unlock()
		if empty {
			return nil
		}
		select {
		case <-drained:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run publishes until ctx ends.
func (p *publisher) run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for {
		p.mu.Lock()
		batch := append([]*outMsg(nil), p.queue[:min(len(p.queue), p.window)]...)
		p.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		stored, err := p.publish(batch)
		p.mu.Lock()
		p.queue = p.queue[stored:]
		if len(p.queue) == 0 {
			close(p.drained)
			p.drained = make(chan struct{})
		}
		p.mu.Unlock()
		if err == nil {
			backoff = 50 * time.Millisecond
			continue
		}
		p.log.Warn("storing events failed; retrying", "pending", p.pending(), "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		p.skipStored(ctx)
	}
}

// publish sends a batch asynchronously and returns how many messages, from
// the front, are known stored, and the first error.
func (p *publisher) publish(batch []*outMsg) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(batch))
	var firstErr error
	for _, m := range batch {
		f, err := p.js.PublishMsgAsync(m.msg)
		if err != nil {
			firstErr = err
			break
		}
		futures = append(futures, f)
	}
	stored := -1
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if stored < 0 {
				stored, firstErr = i, err
			}
		}
	}
	if stored < 0 {
		stored = len(futures)
	}
	return stored, firstErr
}

// skipStored drops queued events that the stream already holds, judged by
// each agent's last stored event number.
func (p *publisher) skipStored(ctx context.Context) {
	p.mu.Lock()
	agents := map[string]bool{}
	for _, m := range p.queue {
		agents[m.agent] = true
	}
	p.mu.Unlock()
	stream, err := p.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return
	}
	last := map[string]uint64{}
	for id := range agents {
		n, err := lastEventNumber(ctx, stream, id)
		if err != nil {
			return
		}
		last[id] = n
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.queue[:0]
	for _, m := range p.queue {
		if m.seq > last[m.agent] {
			kept = append(kept, m)
		}
	}
	p.queue = kept
}

// lastEventNumber is the event number of the last stored event of an
// agent, 0 when it has none.
func lastEventNumber(ctx context.Context, stream jetstream.Stream, id string) (uint64, error) {
	m, err := stream.GetLastMsgForSubject(ctx, schemas.EventSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	_, n, err := schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// eventMsg builds the NATS message of an event.
func eventMsg(node, agent string, seq uint64, payload []byte, at time.Time) *nats.Msg {
	m := nats.NewMsg(schemas.EventSubject(agent))
	m.Data = payload
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(agent, seq))
	m.Header.Set(schemas.HeaderNode, node)
	m.Header.Set(schemas.HeaderTime, at.UTC().Format(time.RFC3339Nano))
	return m
}
