package client

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// Anything may be published on an agent's subject by a client the fabric
// trusts (without --auth, any local client), and the stream stores it. A
// reader takes from it only the agent's events: a message with the
// agent's event number and a Kaimon envelope, in number order. Everything
// else is a stray: the reader skips it, says so once (Replayed.Stray), and
// goes on with the agent's events.
//
// The order is the node's: it numbers an agent's events from 1 and the
// stream stores them in that order. So a reader expects each agent's next
// number. A number below it is a copy of an event already read. A number
// above it is a gap only when it explains itself: the first event of an
// agent's stored history (retention drops the oldest), or a node's error
// naming exactly the numbers it lost with its journal. Otherwise the event
// is held until the next one of the agent tells: the number expected
// means the held one was a stray; the number after the held one means the
// agent's events did jump there (a gap), and both are delivered.

// Stray reasons.
const (
	strayNoNumber    = "it has no event number"
	strayNotEnvelope = "it is not an event envelope"
)

// sequencer sorts what a reader takes from agents' subjects into each
// agent's events, in order, and strays.
type sequencer struct {
	// open says a reader starts at the stream's beginning: an agent's first
	// message is the first of its stored history, whatever its number.
	open bool
	// anchor finds the number of an agent's last event stored before a
	// stream sequence, for a reader that starts elsewhere (nil: none).
	anchor func(ctx context.Context, agent string, before uint64) (last uint64, found bool, err error)
	agents map[string]*agentOrder
}

// agentOrder is what a reader knows of one agent's order.
type agentOrder struct {
	next  uint64    // the number expected next; 0 when any may come first
	known bool      // next has been set
	held  *Replayed // an event out of sequence, until the next one tells
}

// delivery is one thing a reader delivers: an event with the gap before
// it, or a stray.
type delivery struct {
	r   Replayed
	gap *Gap
}

func newSequencer(open bool, anchor func(context.Context, string, uint64) (uint64, bool, error)) *sequencer {
	return &sequencer{open: open, anchor: anchor, agents: map[string]*agentOrder{}}
}

// expect says the number an agent's first event should have.
func (q *sequencer) expect(agent string, next uint64) {
	q.agents[agent] = &agentOrder{next: next, known: true}
}

// add takes one message and returns what the reader delivers now.
func (q *sequencer) add(ctx context.Context, r Replayed) ([]delivery, error) {
	if r.Stray != "" {
		return []delivery{{r: r}}, nil
	}
	o := q.agents[r.Agent]
	if o == nil {
		o = &agentOrder{}
		q.agents[r.Agent] = o
		switch {
		case q.open:
			o.next, o.known = 1, true
			// The first stored event of an agent is where its history
			// starts now, whatever its number: retention drops the oldest.
			return o.take(r, gapBefore(r, 1)), nil
		case q.anchor != nil:
			last, found, err := q.anchor(ctx, r.Agent, r.Seq)
			if err != nil {
				return nil, err
			}
			if found {
				o.next, o.known = last+1, true
			}
		}
		if !o.known {
			o.known = true
			return o.take(r, nil), nil
		}
	}
	switch {
	case r.N == o.next:
		return append(o.strayHeld(nil), o.take(r, nil)...), nil
	case r.N < o.next:
		r.Stray = fmt.Sprintf("it is a copy of event %d, read before", r.N)
		return []delivery{{r: r}}, nil
	}
	if from, to, ok := schemas.LostRange(r.Raw); ok && r.Kind == schemas.KindError && from <= o.next && to == r.N-1 {
		gap := &Gap{Agent: r.Agent, From: o.next, To: r.N - 1}
		return append(o.strayHeld(nil), o.take(r, gap)...), nil
	}
	if h := o.held; h != nil && r.N == h.N+1 {
		// The agent's events did jump: the held one was the first after
		// the gap.
		o.held = nil
		out := o.take(*h, &Gap{Agent: h.Agent, From: o.next, To: h.N - 1})
		return append(out, o.take(r, nil)...), nil
	}
	out := o.strayHeld(nil)
	held := r
	o.held = &held
	return out, nil
}

// flush gives up on held events, once a reader has caught up with the
// stream: nothing followed them, so they are strays.
func (q *sequencer) flush() []delivery {
	var out []delivery
	for _, o := range q.agents {
		out = o.strayHeld(out)
	}
	return out
}

// take delivers r and expects the number after it.
func (o *agentOrder) take(r Replayed, gap *Gap) []delivery {
	o.next = r.N + 1
	return []delivery{{r: r, gap: gap}}
}

// strayHeld appends a held event, now known to be a stray, to out.
func (o *agentOrder) strayHeld(out []delivery) []delivery {
	h := o.held
	if h == nil {
		return out
	}
	o.held = nil
	h.Stray = fmt.Sprintf("it is numbered %d where the agent's next event is %d", h.N, o.next)
	return append(out, delivery{r: *h})
}

// gapBefore is the gap between want and r, if r is past it.
func gapBefore(r Replayed, want uint64) *Gap {
	if r.N > want {
		return &Gap{Agent: r.Agent, From: want, To: r.N - 1}
	}
	return nil
}

// Order puts in order what a reader with its own consumer (the Kaimon
// bus) takes from agents' subjects, as a replay does: each agent's events
// in number order, and the strays among them.
type Order struct {
	q *sequencer
}

// NewOrder returns an Order for a reader that starts anywhere in the
// stream; nc reads where an agent's events stand when the reader first
// meets the agent.
func NewOrder(nc *nats.Conn) *Order {
	return &Order{q: newSequencer(false, func(ctx context.Context, agent string, before uint64) (uint64, bool, error) {
		return lastEventBefore(ctx, nc, agent, before)
	})}
}

// Add takes one message of the stream and returns what follows from it,
// in order: the agent's events, and strays (Stray set), which the reader
// passes over. A message on no agent's subject returns nothing.
func (o *Order) Add(ctx context.Context, msg jetstream.Msg) ([]Replayed, error) {
	r, ok := replayed(msg)
	if !ok {
		return nil, nil
	}
	ds, err := o.q.add(ctx, r)
	out := make([]Replayed, len(ds))
	for i, d := range ds {
		out[i] = d.r
	}
	return out, err
}
