package node

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// outMsg is one event waiting to be stored. It holds the few fields its
// NATS message is made of, not the message: an outbox of many thousands
// is then little for the garbage collector to walk, and the message,
// built as it is sent, is short-lived.
type outMsg struct {
	agent string
	seq   uint64
	jseq  uint64    // its record in the journal; 0 without one
	at    time.Time // when it was produced
	// stamp is at as its Shoal-Time header says it, written once for
	// the journal and the message both; "" to write it from at.
	stamp   string
	subject string
	node    string // the node that produced it
	data    []byte
	// header is the message's headers as a journal or the spill recorded
	// them, when it was read back from disk; nil for an event of this
	// run, whose headers follow from the fields above.
	header nats.Header
}

// newOutMsg is the event seq of agent, produced by node at at.
func newOutMsg(subject, node, agent string, seq uint64, data []byte, at time.Time) *outMsg {
	return &outMsg{agent: agent, seq: seq, at: at, stamp: stampTime(at), subject: subject, node: node, data: data}
}

// timeStamp is m's Shoal-Time header.
func (m *outMsg) timeStamp() string {
	if m.stamp != "" {
		return m.stamp
	}
	return stampTime(m.at)
}

// natsMsg is the message that stores m, made in reuse (a message an
// earlier event was stored with) when it is not nil.
func (m *outMsg) natsMsg(reuse *nats.Msg) *nats.Msg {
	if m.header != nil {
		return &nats.Msg{Subject: m.subject, Header: m.header, Data: m.data}
	}
	if reuse == nil {
		return eventMsg(m.subject, m.node, m.agent, m.seq, m.data, m.timeStamp())
	}
	h := reuse.Header
	h[schemas.HeaderMsgID][0] = schemas.MsgID(m.agent, m.seq)
	h[schemas.HeaderNode][0] = m.node
	h[schemas.HeaderTime][0] = m.timeStamp()
	*reuse = nats.Msg{Subject: m.subject, Header: h, Data: m.data}
	return reuse
}

// msgID is m's Nats-Msg-Id.
func (m *outMsg) msgID() string {
	if m.header != nil {
		return m.header.Get(schemas.HeaderMsgID)
	}
	return schemas.MsgID(m.agent, m.seq)
}

// publisher stores events in the AGENTS stream in the order they were
// produced, asynchronously, with a sliding window of unacknowledged
// messages. A failed publish is retried under the same Nats-Msg-Id from the
// failed message on (go-back-N), so nothing is lost and JetStream's
// duplicate window drops what was stored already; before a retry it asks
// the stream for each agent's last stored event number, so a retry after
// a long outage doubles nothing either. Producers never wait for the
// network: while the stream takes events but falls behind, a backend's
// next event waits in hold (its CLI's output in the pipe) instead of
// piling up in the outbox; while the fabric is away nothing waits.
//
// Messages on one connection reach the server in order, and the sender
// stops at the first publish that fails to leave, so the stream keeps each
// agent's order. After a failure it sends one event at a time until the
// stream takes one: while a cluster elects a new stream leader, events
// sent together could straddle the moment it starts storing, the first
// lost and the next stored. What it cannot rule out is a leader handing
// over to another (a planned step-down) while events are in flight.
type publisher struct {
	out    sender
	last   func(context.Context, []string) (map[string]uint64, error)
	window int
	log    *slog.Logger

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*outMsg // unacknowledged, in order; the first sent are in flight
	memBytes int       // the size of queue
	lim      outboxLimits
	spill    *spill    // what follows queue, on disk; nil without a disk tier
	tail     []*outMsg // what follows the spill once the disk tier is full
	tailSize int
	full     bool // both tiers are full: streamed chunks give way
	// spillErr is why the disk tier took no more, when a write to it
	// failed (a full disk) since the outbox last drained.
	spillErr error
	// onFull is told when both tiers fill and when the outbox drains
	// again, with spillErr: whether the disk, not the limits, ran out.
	onFull   func(full bool, spillErr error)
	sent     int         // how many of queue have been sent
	free     []*nats.Msg // messages of events stored already, to make the next ones in
	inflight int         // futures the acker has yet to take
	failed   bool        // a publish failed: drain the window, then go back
	halted   bool        // a publish failed to leave: send nothing more until the retry
	probing  bool        // after a failure, one event at a time until the stream takes one
	stopped  bool
	drained  chan struct{}             // closed and replaced whenever the queue empties
	stored   map[string]uint64         // each agent's last event the stream acknowledged
	waiters  map[string][]storedWaiter // who waits for an agent's events to be stored
	futures  chan future
	// room is closed and replaced once the events waiting to be stored
	// fall to half of ahead (or storing fails, or none is left in memory),
	// releasing those held; holding says someone waits on it.
	room    chan struct{}
	holding bool
	// draining says the events waiting are an outage's (or what a
	// restart took up from the journal): nobody is held until they are
	// down to ahead, as the outbox is for them.
	draining bool
	journal  *journal           // every event is written here before it is sent; nil for none
	written  chan struct{}      // kicked after each journal write
	queued   map[string]*outMsg // each agent's last event not stored yet
	// acked, when not nil (a confined node, whose relay reads it), is
	// each agent's last event number before which the publisher holds
	// nothing of the agent: every event of it up to that number was
	// acknowledged (or refused for good, or found stored). Each event sent
	// names it (schemas.HeaderAcked).
	acked map[string]uint64
	// onStored is told of each event the stream acknowledged, with how
	// long after its production; nil for none. It must not block.
	onStored func(latency time.Duration)
	// lease is how long the node's heartbeat entry is sure to live after
	// its last write (zero until the first): past it the coordinator may
	// have taken the node for lost and closed its agents' streams, so
	// nothing is sent until the host has asked whether its agents are
	// still its own (lapsed). onLapse is told, once a lapse; it must not
	// block.
	lease   time.Time
	lapsed  bool
	onLapse func()
	// gone holds the agents the fabric took for lost while this node ran
	// them: their events up to the number given, the last their life
	// handed out, are dropped unsent.
	gone map[string]uint64
}

// errTakenForLost is the outcome of an event of an agent the fabric took
// for lost: it was dropped, not sent.
var errTakenForLost = errors.New("the fabric took the agent for lost")

// outboxLimits bound the events a node keeps while the fabric is away.
type outboxLimits struct {
	Memory int   // bytes in memory before spilling to disk
	Disk   int64 // bytes on disk before the outbox is full
}

func newPublisher(out sender, last func(context.Context, []string) (map[string]uint64, error), window int, lim outboxLimits, sp *spill, log *slog.Logger) *publisher {
	p := &publisher{out: out, last: last, window: window, lim: lim, spill: sp, log: log, drained: make(chan struct{}),
		stored: map[string]uint64{}, waiters: map[string][]storedWaiter{}, queued: map[string]*outMsg{}, gone: map[string]uint64{},
		futures: make(chan future, window), room: make(chan struct{}), draining: true}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// useJournal writes every event to j before it is sent. The journal's
// writer only kicks the publisher: it must never wait for the publisher's
// lock, which an enqueue waiting for the journal may hold.
func (p *publisher) useJournal(j *journal) {
	p.journal = j
	p.written = make(chan struct{}, 1)
	j.onWrite = func() {
		select {
		case p.written <- struct{}{}:
		default:
		}
	}
}

// wakeOnWrites wakes the sender after each journal write, until ctx ends.
func (p *publisher) wakeOnWrites(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.written:
		}
		// Woken under the lock, so a sender that has just found the
		// record unwritten is waiting before it is woken.
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	}
}

// refusesAcked reports whether err is a relay's refusal of the
// schemas.HeaderAcked header, which a relay of an earlier version does
// not know.
func refusesAcked(err error) bool {
	return refused(err) && strings.Contains(err.Error(), "header "+schemas.HeaderAcked+" may not be set by a node")
}

// pendingTail is how an agent's events end when some are not stored yet:
// the tail of its last event in the outbox; false when all are stored.
func (p *publisher) pendingTail(agent string) (schemas.Tail, bool) {
	p.mu.Lock()
	m := p.queued[agent]
	p.mu.Unlock()
	if m == nil {
		return schemas.Tail{}, false
	}
	t, err := schemas.TailOf(m.msgID(), m.data)
	return t, err == nil
}

func msgSize(m *outMsg) int { return len(m.data) + len(m.subject) + 128 }

// outboxAhead is how many bytes of events may wait to be stored while the
// stream takes them before a backend's next event is held: some tens of
// milliseconds of a firehose, enough to keep the window full. Past it,
// reading a CLI faster than the stream stores only moves its output
// from the pipe into the outbox (and, past the memory tier, to disk and
// back), which costs the node what the stream needs.
const outboxAhead = 4 << 20

// ahead is the bytes of events waiting to be stored past which a
// backend's events are held; p.mu is held.
func (p *publisher) ahead() int64 { return int64(min(outboxAhead, p.lim.Memory/2)) }

// waiting is the bytes of events waiting to be stored, in every tier;
// p.mu is held.
func (p *publisher) waiting() int64 {
	n := int64(p.memBytes + p.tailSize)
	if p.spill != nil {
		n += p.spill.unread()
	}
	return n
}

// hold waits while the stream is taking events and more than ahead bytes
// of them wait to be stored, until half as many do, storing fails, or ctx
// ends. A backend's reader calls it before each event, so a CLI printing
// faster than the stream stores waits on its pipe, as it would behind a
// slow terminal. While the fabric is away (a publish failed, the sender is
// retrying), and after it until what waited meanwhile is down to ahead, it
// returns at once: the outbox is for that. It never waits with nothing in
// memory to store, whose acknowledgement would release it.
func (p *publisher) hold(ctx context.Context) {
	p.mu.Lock()
	if p.waiting() <= p.ahead() {
		if !p.failed && !p.halted {
			p.draining = false
		}
		p.mu.Unlock()
		return
	}
	if p.draining || len(p.queue) == 0 || p.stopped || p.failed || p.halted || p.probing {
		p.mu.Unlock()
		return
	}
	p.holding = true
	room := p.room
	p.mu.Unlock()
	select {
	case <-room:
	case <-ctx.Done():
	}
}

// release lets every held backend go on; p.mu is held.
func (p *publisher) release() {
	if p.holding {
		close(p.room)
		p.room, p.holding = make(chan struct{}), false
	}
}

// enqueue adds a message; it never blocks on the network. Past the memory
// limit messages go to disk (and keep going there, to stay in order,
// until the disk tier is read back); past both the outbox is full.
func (p *publisher) enqueue(m *outMsg) {
	p.mu.Lock()
	if p.journal != nil {
		m.jseq = p.journal.append(m)
	}
	if p.acked != nil && p.queued[m.agent] == nil {
		// Nothing of the agent waits: every number before this one is
		// done with (numbers are handed out in order, and a restart
		// takes up what its journal kept, in order, before anything new).
		p.acked[m.agent] = max(p.acked[m.agent], m.seq-1)
	}
	p.queued[m.agent] = m
	size := msgSize(m)
	spilling := p.spill != nil && p.spill.count > 0
	switch {
	case len(p.tail) > 0 || (spilling && p.spill.unread()+int64(size) > p.lim.Disk):
		// The disk tier is full: keep it in memory, after the spill.
		p.tail, p.tailSize = append(p.tail, m), p.tailSize+size
	case p.spill != nil && (spilling || p.memBytes+size > p.lim.Memory):
		if err := p.spill.push(m); err != nil {
			p.log.Error("cannot spill events to disk; keeping them in memory", "err", err)
			p.tail, p.tailSize = append(p.tail, m), p.tailSize+size
			p.spillErr = err
		}
	default:
		p.queue, p.memBytes = append(p.queue, m), p.memBytes+size
	}
	full := p.memBytes+p.tailSize > p.lim.Memory // memory, and the disk tier if any, are full
	changed := full && !p.full
	p.full = p.full || full
	spillErr := p.spillErr
	p.mu.Unlock()
	if p.journal == nil {
		// With a journal the sender waits for the record to be written,
		// and the write wakes it.
		p.cond.Signal()
	}
	if changed && p.onFull != nil {
		p.onFull(true, spillErr)
	}
}

// saturated reports whether the outbox is full, so streamed chunks, which
// only serve liveness, are not kept.
func (p *publisher) saturated() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.full
}

// pending is how many events wait to be stored.
func (p *publisher) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.queue) + len(p.tail)
	if p.spill != nil {
		n += p.spill.count
	}
	return n
}

// flush waits until every event enqueued so far is stored, or ctx ends.
func (p *publisher) flush(ctx context.Context) error {
	for {
		p.mu.Lock()
		empty, drained := len(p.queue)+len(p.tail) == 0 && (p.spill == nil || p.spill.count == 0), p.drained
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
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.stopped = true
		p.release()
		p.mu.Unlock()
		p.cond.Broadcast()
	})
	defer stop()
	if p.written != nil {
		wakes, stopWakes := context.WithCancel(ctx)
		defer stopWakes()
		go p.wakeOnWrites(wakes)
	}
	go p.send()
	p.ack(ctx)
}

// send publishes queued messages while the window has room.
func (p *publisher) send() {
	for {
		p.mu.Lock()
		for !p.stopped && (p.failed || p.halted || p.lapsed || !p.ready(0) || p.inflight >= p.window || (p.probing && p.sent > 0)) {
			if p.sent >= len(p.queue) && p.refill() {
				continue
			}
			if !p.ready(0) || p.lapsed {
				p.out.idle() // nothing to send: what was sent is acknowledged soon
			}
			p.cond.Wait()
		}
		if p.stopped {
			p.mu.Unlock()
			p.out.close()
			close(p.futures)
			return
		}
		if !p.lease.IsZero() && leaseOver(time.Now(), p.lease) {
			p.lapsed = true
			onLapse := p.onLapse
			p.mu.Unlock()
			if onLapse != nil {
				onLapse()
			}
			continue
		}
		m := p.queue[p.sent]
		p.sent++
		p.inflight++
		if last, ok := p.gone[m.agent]; ok && m.seq <= last {
			p.mu.Unlock()
			p.futures <- failedFuture{err: errTakenForLost}
			continue
		}
		alone := p.probing
		var reuse *nats.Msg
		if n := len(p.free); n > 0 && m.header == nil {
			reuse, p.free = p.free[n-1], p.free[:n-1]
		}
		acked, claims := p.acked[m.agent], p.acked != nil
		p.mu.Unlock()
		msg := m.natsMsg(reuse)
		if claims {
			msg.Header[schemas.HeaderAcked] = []string{strconv.FormatUint(acked, 10)}
		} else {
			delete(msg.Header, schemas.HeaderAcked) // sent with it before
		}
		f, err := p.out.send(msg, alone)
		if err != nil {
			// Stop here: sending the next message before this one is
			// stored would put them out of order.
			p.mu.Lock()
			p.halted, p.draining = true, true
			p.release()
			p.mu.Unlock()
			f = failedFuture{msg: msg, err: err}
		}
		p.futures <- f
	}
}

// ready reports whether the event k after the last one sent may be sent
// now: it is queued, and written to the journal if there is one. p.mu is
// held.
func (p *publisher) ready(k int) bool {
	i := p.sent + k
	return i < len(p.queue) && (p.journal == nil || p.journal.hasWritten(p.queue[i].jseq))
}

// ack takes the acknowledgements in order. The first failure stops the
// sender; once the window has drained, the unacknowledged tail is sent
// again after a pause.
func (p *publisher) ack(ctx context.Context) {
	backoff := 50 * time.Millisecond
	var firstErr error
	var warned time.Time // the last retry warning
	for f := range p.futures {
		err := f.wait()
		var storedAt time.Time
		moved := false
		p.mu.Lock()
		p.inflight--
		switch {
		case p.failed:
		case p.acked != nil && refusesAcked(err):
			// A relay of an earlier version (a cluster's server not yet
			// upgraded, a coordinator rolled back) refuses the node's
			// word; everything from here goes again without it.
			p.log.Warn("the coordinator's relay does not read "+schemas.HeaderAcked+"; the node no longer sends it", "err", err)
			p.acked = nil
			p.failed, p.draining, firstErr = true, true, err
		case err == nil || refused(err) || errors.Is(err, errTakenForLost):
			if err != nil && !errors.Is(err, errTakenForLost) {
				// The relay refused it for good: the agent is no longer
				// this node's. Keeping it would block every agent behind it.
				p.log.Error("the fabric refused an event; it is dropped", "subject", p.queue[0].subject, "err", err)
			}
			m := p.queue[0]
			if err == nil {
				storedAt = m.at
				// Stored: nothing holds its message any more.
				if msg := f.Msg(); msg != nil && m.header == nil && len(p.free) < p.window {
					p.free = append(p.free, msg)
				}
			}
			dropped := errors.Is(err, errTakenForLost)
			if !dropped {
				// A dropped event is not stored, nor acknowledged: the
				// node's word names only what is.
				p.stored[m.agent] = m.seq
				if p.acked != nil {
					p.acked[m.agent] = max(p.acked[m.agent], m.seq)
				}
			}
			if p.queued[m.agent] == m {
				delete(p.queued, m.agent)
			}
			p.passed(m)
			if p.journal != nil {
				p.journal.retire(m.jseq)
			}
			if ws := p.waiters[m.agent]; len(ws) > 0 {
				if dropped {
					p.wake(m.agent, m.seq, errTakenForLost) // not stored: whoever waits is told
				} else {
					p.wake(m.agent, m.seq, nil)
				}
			}
			p.memBytes -= msgSize(m)
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.sent--
			moved = p.refill()
			if len(p.queue) == 0 && len(p.tail) == 0 {
				close(p.drained)
				p.drained = make(chan struct{})
			}
			backoff = 50 * time.Millisecond
			p.probing = false
		default:
			p.failed, p.draining, firstErr = true, true, err
		}
		if p.draining && !p.failed && p.waiting() <= p.ahead() {
			p.draining = false // what waited while the fabric was away is stored
		}
		if p.holding && (p.failed || p.waiting() <= p.ahead()/2 || len(p.queue) == 0) {
			// Released at half, or on a failure, or with nothing left
			// in memory whose acknowledgement would come to release it.
			p.release()
		}
		retry := p.failed && p.inflight == 0
		// The sender is woken once a batch of the window is free (or the
		// window is empty, or the queue took what waited on disk), not at
		// every acknowledgement: it then sends the batch together.
		wake := p.inflight <= p.window-max(1, p.window/8) || p.inflight == 0 || moved
		drained := p.full && p.memBytes+p.tailSize <= p.lim.Memory/2 && (p.spill == nil || p.spill.count == 0)
		spillErr := p.spillErr
		if drained || (p.memBytes+p.tailSize == 0 && (p.spill == nil || p.spill.count == 0)) {
			// Drained after filling, or nothing waits at all: a disk
			// error before is no longer the outbox's.
			p.full, p.spillErr = false, nil
		}
		p.mu.Unlock()
		if !storedAt.IsZero() && p.onStored != nil {
			p.onStored(time.Since(storedAt))
		}
		if drained && p.onFull != nil {
			p.onFull(false, spillErr)
		}
		if wake {
			p.cond.Broadcast()
		}
		if !retry {
			continue
		}
		if backoff == 50*time.Millisecond || time.Since(warned) >= retryWarnEvery {
			// The first failure of a streak, then one line in a while:
			// a fabric away for minutes is not a screenful of warnings.
			p.log.Warn("storing events failed; retrying", "pending", p.pending(), "err", firstErr)
			warned = time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		p.skipStored(ctx)
		p.out.restart()
		p.mu.Lock()
		p.failed, p.halted, p.probing, p.sent = false, false, true, 0
		p.mu.Unlock()
		firstErr = nil
		p.cond.Broadcast()
	}
}

// retryWarnEvery is how often a streak of failed stores is logged after
// its first failure.
const retryWarnEvery = 30 * time.Second

// storedWaiter is a wait for an agent's events up to seq to be stored.
type storedWaiter struct {
	seq  uint64
	done chan struct{}
	err  *error // set before done is closed: the events were not stored
}

// waitStored waits until the stream holds the agent's events up to seq,
// or ctx ends: a reply that says a turn is over is sent once the turn can
// be read back from the stream.
func (p *publisher) waitStored(ctx context.Context, agent string, seq uint64) error {
	p.mu.Lock()
	if p.stored[agent] >= seq {
		p.mu.Unlock()
		return nil
	}
	var failed error
	w := storedWaiter{seq: seq, done: make(chan struct{}), err: &failed}
	p.waiters[agent] = append(p.waiters[agent], w)
	p.mu.Unlock()
	select {
	case <-w.done:
		return failed
	case <-ctx.Done():
		p.mu.Lock()
		ws := p.waiters[agent]
		for i := range ws {
			if ws[i].done == w.done {
				p.waiters[agent] = slices.Delete(ws, i, i+1)
				break
			}
		}
		if len(p.waiters[agent]) == 0 {
			delete(p.waiters, agent)
		}
		p.mu.Unlock()
		return ctx.Err()
	}
}

// wake releases the waiters of agent whose events up to seq are done
// with: stored, or, with err, not; p.mu is held.
func (p *publisher) wake(agent string, seq uint64, err error) {
	ws := p.waiters[agent][:0]
	for _, w := range p.waiters[agent] {
		if w.seq <= seq {
			*w.err = err
			close(w.done)
		} else {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		delete(p.waiters, agent)
	} else {
		p.waiters[agent] = ws
	}
}

// leaseOver reports whether the lease ended by now, by the monotonic
// clock (a process stopped, a clock set back) or by the wall clock (a
// machine asleep, whose monotonic clock stood still).
func leaseOver(now, lease time.Time) bool {
	return now.After(lease) || now.Round(0).After(lease.Round(0))
}

// extend moves the lease to until after a write of the node's heartbeat
// was acknowledged. A beat acknowledged after the lease ended renews
// nothing, wherever it began: it may have been stored (held by the
// network) after the node's entry expired and the coordinator took the
// node for lost, so the lapse is the host's to check (onLapse), and
// resume ends it.
func (p *publisher) extend(until time.Time) {
	p.mu.Lock()
	if p.lapsed {
		p.mu.Unlock()
		return
	}
	if !p.lease.IsZero() && leaseOver(time.Now(), p.lease) {
		p.lapsed = true
		onLapse := p.onLapse
		p.mu.Unlock()
		if onLapse != nil {
			onLapse()
		}
		return
	}
	if until.After(p.lease) {
		p.lease = until
	}
	p.mu.Unlock()
}

// resume ends a lapse once the host has found which of its agents are
// still its own (and dropped the others).
func (p *publisher) resume(until time.Time) {
	p.mu.Lock()
	if until.After(p.lease) {
		p.lease = until
	}
	p.lapsed = false
	p.mu.Unlock()
	p.cond.Broadcast()
}

// drop stops sending an agent's events up to last, the last number its
// life handed out, which the fabric took for lost: its stream was closed
// without this node. Events of the id queued after them (a later life)
// go as usual.
func (p *publisher) drop(agent string, last uint64) {
	p.mu.Lock()
	if p.stored[agent] < last {
		p.gone[agent] = last
	}
	p.mu.Unlock()
}

// passed forgets a dropped agent once its last dropped event has left
// the outbox; p.mu is held.
func (p *publisher) passed(m *outMsg) {
	if last, ok := p.gone[m.agent]; ok && m.seq >= last {
		delete(p.gone, m.agent) // what follows is a later life's
	}
}

// forget drops what the publisher knows of an agent the node no longer
// keeps.
func (p *publisher) forget(agent string) {
	p.mu.Lock()
	delete(p.stored, agent)
	if p.queued[agent] == nil {
		// What of it still waits is sent naming its word.
		delete(p.acked, agent)
	}
	p.mu.Unlock()
}

// refill brings what waits after the queue into it once there is room:
// spilled messages first, then the tail kept in memory after them. It
// reports whether it moved any; p.mu is held.
func (p *publisher) refill() bool {
	if p.memBytes > p.lim.Memory/2 {
		return false
	}
	moved := false
	if p.spill != nil && p.spill.count > 0 {
		ms, err := p.spill.pop(4096, p.lim.Memory/2)
		if err != nil {
			p.log.Error("reading the outbox back from disk", "err", err)
		}
		for _, m := range ms {
			p.queue = append(p.queue, m)
			p.memBytes += msgSize(m)
		}
		moved = len(ms) > 0
	}
	if (p.spill == nil || p.spill.count == 0) && len(p.tail) > 0 {
		p.queue = append(p.queue, p.tail...)
		p.memBytes += p.tailSize
		p.tail, p.tailSize = nil, 0
		moved = true
	}
	return moved
}

// failedFuture is the future of a publish that failed before it left.
type failedFuture struct {
	msg *nats.Msg
	err error
}

func (f failedFuture) wait() error    { return f.err }
func (f failedFuture) Msg() *nats.Msg { return f.msg }

// skipStoredWait bounds skipStored's read of where each agent's stream
// ends.
const skipStoredWait = 10 * time.Second

// skipStored drops queued events that the stream already holds, judged by
// each agent's last stored event number.
func (p *publisher) skipStored(ctx context.Context) {
	p.mu.Lock()
	agents := map[string]bool{}
	for _, m := range p.queue {
		agents[m.agent] = true
	}
	p.mu.Unlock()
	// A read that gets no answer (its request or reply lost with a
	// connection, as a relay's can be) must not hold the publisher: after
	// skipStoredWait it sends everything queued again, and the stream's
	// duplicate window drops what had landed. It waited for ever, and a
	// confined node stored nothing more of its agents.
	lctx, cancel := context.WithTimeout(ctx, skipStoredWait)
	defer cancel()
	last, err := p.last(lctx, slices.Collect(maps.Keys(agents)))
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.queue[:0]
	for _, m := range p.queue {
		if m.seq > last[m.agent] {
			kept = append(kept, m)
			continue
		}
		if p.acked != nil {
			p.acked[m.agent] = max(p.acked[m.agent], m.seq)
		}
		if p.queued[m.agent] == m {
			delete(p.queued, m.agent)
		}
		p.passed(m)
	}
	if p.journal != nil && len(p.queue) > 0 {
		// The stored ones are done with; what is kept starts the journal's
		// unacknowledged part.
		if len(kept) > 0 {
			p.journal.retire(kept[0].jseq - 1)
		} else {
			p.journal.retire(p.queue[len(p.queue)-1].jseq)
		}
	}
	clear(p.queue[len(kept):])
	p.queue = kept
	p.memBytes = 0
	for _, m := range p.queue {
		p.memBytes += msgSize(m)
	}
	if len(p.queue) == 0 {
		close(p.drained)
		p.drained = make(chan struct{})
	}
}

// eventMsg builds the NATS message of an event.
func eventMsg(subject, node, agent string, seq uint64, payload []byte, stamp string) *nats.Msg {
	// The header names are already canonical, so they are set directly.
	return &nats.Msg{
		Subject: subject,
		Data:    payload,
		Header: nats.Header{
			schemas.HeaderMsgID: {schemas.MsgID(agent, seq)},
			schemas.HeaderNode:  {node},
			schemas.HeaderTime:  {stamp},
		},
	}
}
