package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
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
		return lostAck{m}, nil
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

// lostAck is the acknowledgement of a publish that never comes: it fails.
type lostAck struct{ msg *nats.Msg }

func (f lostAck) Ok() <-chan *jetstream.PubAck { return nil }
func (f lostAck) Msg() *nats.Msg               { return f.msg }
func (f lostAck) Err() <-chan error {
	c := make(chan error, 1)
	c <- errFlaky
	return c
}

func (f *flakyJS) count() {
	f.mu.Lock()
	f.fails++
	f.mu.Unlock()
}

// Failed publishes are retried from the failure on, under the same ids:
// the stream ends up with every event once, in order. Asynchronous
// publishes fail before they leave or lose their acknowledgement; in fast
// batches, events are lost on the way (the stream sees a gap and ends the
// batch) or fail to leave.
func TestPublisherRetriesLoseAndDoubleNothing(t *testing.T) {
	for _, way := range []string{"async", "batches"} {
		t.Run(way, func(t *testing.T) {
			b := natstest.Start(t)
			nc, js := natstest.JetStream(t, b)
			var out sender
			var fails func() int
			if way == "async" {
				flaky := &flakyJS{JetStream: js}
				out, fails = asyncSender{flaky}, func() int { flaky.mu.Lock(); defer flaky.mu.Unlock(); return flaky.fails }
			} else {
				// Lost events are known by a missing acknowledgement: the
				// wait for one is short here.
				bs, err := newBatchSender(nc, 16, 200*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var n, injected int
				bs.publish = func(m *nats.Msg) error {
					mu.Lock()
					n++
					k := n
					if k%17 == 0 || k%29 == 0 {
						injected++
					}
					mu.Unlock()
					switch {
					case k%17 == 0:
						return nil // lost on the way
					case k%29 == 0:
						return errFlaky // never sent
					}
					return nc.PublishMsg(m)
				}
				out, fails = bs, func() int { mu.Lock(); defer mu.Unlock(); return injected }
			}
			p := newPublisher(out, testStore(t, nc, js).lastEvents, 16, outboxLimits{Memory: 64 << 20}, nil, slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { p.run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			const n = 200
			for _, id := range []string{"a", "b"} {
				for i := uint64(1); i <= n; i++ {
					p.enqueue(newOutMsg(schemas.EventSubject(id), "n", id, i, []byte(fmt.Sprintf(`{"n":%d}`, i)), time.Now()))
				}
			}
			fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
			defer fcancel()
			if err := p.flush(fctx); err != nil {
				t.Fatalf("flush: %v (pending %d)", err, p.pending())
			}
			if fails() == 0 {
				t.Fatal("no failure was injected")
			}
			storedOnce(t, js, []string{"a", "b"}, n)
		})
	}
}

// storedOnce checks that the stream holds each agent's events 1 to n,
// once each and in order.
func storedOnce(t *testing.T, js jetstream.JetStream, ids []string, n uint64) {
	t.Helper()
	ctx := t.Context()
	s, _ := js.Stream(ctx, schemas.StreamName)
	for _, id := range ids {
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

// downJS refuses every publish while down, as a node's connection does
// while the coordinator is away.
type downJS struct {
	jetstream.JetStream
	down atomic.Bool
}

func (d *downJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if d.down.Load() {
		return nil, nats.ErrConnectionReconnecting
	}
	return d.JetStream.PublishMsgAsync(m, opts...)
}

// While the fabric is away events wait in memory, then on disk; when it
// returns they are stored in order, once. Past both limits the outbox is
// full, and says so when it has drained.
func TestOutboxSpillsToDiskAndDrains(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	d := &downJS{JetStream: js}
	d.down.Store(true)
	sp, err := openSpill(filepath.Join(t.TempDir(), "outbox.spill"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	p := newPublisher(asyncSender{d}, testStore(t, nc, js).lastEvents, 16, outboxLimits{Memory: 8 << 10, Disk: 64 << 10}, sp, slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var signals []bool
	p.onFull = func(full bool, _ error) { mu.Lock(); signals = append(signals, full); mu.Unlock() }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	payload := strings.Repeat("x", 200)
	n := uint64(0)
	push := func(k int) {
		for range k {
			n++
			p.enqueue(newOutMsg(schemas.EventSubject("o"), "n", "o", n, []byte(fmt.Sprintf(`{"n":%d,"p":%q}`, n, payload)), time.Now()))
		}
	}
	push(100) // ~40 KB: past memory, onto disk
	p.mu.Lock()
	spilled := sp.count
	p.mu.Unlock()
	if spilled == 0 || p.saturated() {
		t.Fatalf("after 40 KB: %d on disk, full %v", spilled, p.saturated())
	}
	push(300) // past the disk too
	if !p.saturated() {
		t.Fatal("the outbox is not full past both limits")
	}
	d.down.Store(false) // the fabric is back
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	defer fcancel()
	if err := p.flush(fctx); err != nil {
		t.Fatalf("flush: %v (pending %d)", err, p.pending())
	}
	if p.saturated() {
		t.Error("still full after draining")
	}
	mu.Lock()
	if len(signals) != 2 || !signals[0] || signals[1] {
		t.Errorf("full signals %v, want [true false]", signals)
	}
	mu.Unlock()
	s, _ := js.Stream(ctx, schemas.StreamName)
	cons, _ := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"agent.o"}})
	for want := uint64(1); want <= n; want++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("event %d missing: %v", want, err)
		}
		if _, got, _ := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID)); got != want {
			t.Fatalf("event %d where %d belongs", got, want)
		}
	}
	p.mu.Lock()
	if sp.count != 0 || sp.size != 0 {
		t.Errorf("spill file not emptied: %d records, %d bytes", sp.count, sp.size)
	}
	p.mu.Unlock()
}

// An outbox that fills because the node's disk takes no more of it (here
// its spill file is /dev/full, whose every write fails as a full disk's
// does) says so: the full and drained signals carry the disk's error, so
// the agents' streams blame the disk, not the outbox's limits. Every
// event is still stored, in order.
func TestOutboxFilledByAFullDiskSaysSo(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	d := &downJS{JetStream: js}
	d.down.Store(true)
	// Opened here, not by openSpill: its close removes its file.
	full, err := os.OpenFile("/dev/full", os.O_RDWR, 0)
	if fi, serr := os.Stat("/dev/full"); err != nil || serr != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("the test writes its spill to /dev/full, a device every write to fails as a full disk's; this machine's is not one: %v %v", err, serr)
	}
	defer full.Close()
	sp := &spill{f: full}
	p := newPublisher(asyncSender{d}, testStore(t, nc, js).lastEvents, 16, outboxLimits{Memory: 64 << 10, Disk: 64 << 20}, sp, slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var causes []error
	var signals []bool
	p.onFull = func(full bool, cause error) {
		mu.Lock()
		signals, causes = append(signals, full), append(causes, cause)
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	payload := strings.Repeat("x", 400)
	n := uint64(0)
	for !p.saturated() && n < 10000 {
		n++
		p.enqueue(newOutMsg(schemas.EventSubject("o"), "n", "o", n, []byte(fmt.Sprintf(`{"n":%d,"p":%q}`, n, payload)), time.Now()))
	}
	if !p.saturated() {
		t.Fatalf("%d events of 400 bytes into 64 KiB of memory and a disk that takes nothing: not full", n)
	}
	d.down.Store(false)
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	defer fcancel()
	if err := p.flush(fctx); err != nil {
		t.Fatalf("flush: %v (pending %d)", err, p.pending())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(signals) != 2 || !signals[0] || signals[1] || !errors.Is(causes[0], syscall.ENOSPC) || !errors.Is(causes[1], syscall.ENOSPC) {
		t.Errorf("full signals %v with causes %v, want [true false], each with the disk's ENOSPC", signals, causes)
	}
	st, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("agent.o"))
	last, lerr := st.GetLastMsgForSubject(ctx, "agent.o")
	if err != nil || lerr != nil || info.State.Subjects["agent.o"] != n || last.Header.Get(schemas.HeaderMsgID) != schemas.MsgID("o", n) {
		t.Errorf("agent o's events stored: %v (%v, %v); want %d, the last %s", info.State.Subjects, err, lerr, n, schemas.MsgID("o", n))
	}
}

// testStore reaches the test's JetStream directly.
func testStore(t *testing.T, nc *nats.Conn, js jetstream.JetStream) *directStore {
	t.Helper()
	s, err := newDirectStore(t.Context(), nc, js, "n")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// electingJS answers every publish "no responders", a little later, as
// a server would, until its upAfter-th publish; then it stores them: a
// cluster electing a new stream leader.
type electingJS struct {
	jetstream.JetStream
	upAfter int64
	n       atomic.Int64
}

func (e *electingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if e.n.Add(1) <= e.upAfter {
		return lateFailure{msg: m, err: jetstream.ErrNoStreamResponse, after: 20 * time.Millisecond}, nil
	}
	return e.JetStream.PublishMsgAsync(m, opts...)
}

// lateFailure is a publish that fails after a while.
type lateFailure struct {
	msg   *nats.Msg
	err   error
	after time.Duration
}

func (f lateFailure) Ok() <-chan *jetstream.PubAck { return nil }
func (f lateFailure) Msg() *nats.Msg               { return f.msg }
func (f lateFailure) Err() <-chan error {
	c := make(chan error, 1)
	time.AfterFunc(f.after, func() { c <- f.err })
	return c
}

// A stream that starts storing again in the middle of a retry gets the
// events in order: after a failure the publisher sends one at a time
// until the stream takes one.
func TestPublisherRetryStraddlesANewLeader(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	const window = 16
	e := &electingJS{JetStream: js, upAfter: window + 4} // up within the first retry
	p := newPublisher(asyncSender{e}, testStore(t, nc, js).lastEvents, window, outboxLimits{Memory: 64 << 20}, nil, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	const n = 50
	for i := uint64(1); i <= n; i++ {
		p.enqueue(newOutMsg(schemas.EventSubject("e"), "n", "e", i, []byte(fmt.Sprintf(`{"n":%d}`, i)), time.Now()))
	}
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	defer fcancel()
	if err := p.flush(fctx); err != nil {
		t.Fatalf("flush: %v (pending %d)", err, p.pending())
	}
	s, _ := js.Stream(ctx, schemas.StreamName)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject("e")}})
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); want <= n; want++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("event %d missing: %v", want, err)
		}
		if _, got, _ := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID)); got != want {
			t.Fatalf("event %d stored where %d belongs", got, want)
		}
	}
}

// gatedSender stores nothing itself: each event it sends is acknowledged
// when the test hands its future an answer (nil: stored); once closed,
// what is unanswered fails.
type gatedSender struct {
	answers chan error
	stop    chan struct{}
}

func (s gatedSender) send(msg *nats.Msg, _ bool) (future, error) {
	return gatedFuture{s, msg}, nil
}
func (gatedSender) idle()    {}
func (gatedSender) restart() {}
func (s gatedSender) close() { close(s.stop) }

type gatedFuture struct {
	s   gatedSender
	msg *nats.Msg
}

func (f gatedFuture) wait() error {
	select {
	case err := <-f.s.answers:
		return err
	case <-f.s.stop:
		return nats.ErrConnectionClosed
	}
}
func (f gatedFuture) Msg() *nats.Msg { return f.msg }

// While the stream takes events but falls behind, a backend's next event
// is held once more than the outbox's ahead wait, until half as many do:
// the CLI waits on its pipe rather than the outbox filling and spilling.
// While storing fails nothing is held: that is what the outbox is for.
func TestPublisherHoldsBackendsWhileTheStreamIsBehind(t *testing.T) {
	sp, err := openSpill(filepath.Join(t.TempDir(), "outbox.spill"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	answers := make(chan error)
	gate := gatedSender{answers, make(chan struct{})}
	none := func(context.Context, []string) (map[string]uint64, error) { return map[string]uint64{}, nil }
	p := newPublisher(gate, none, 16, outboxLimits{Memory: 64 << 10, Disk: 1 << 20}, sp, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	payload := []byte(strings.Repeat("x", 1000)) // msgSize 1,137: ahead (32 KiB) is past 28 events
	n := uint64(0)
	push := func(k int) {
		for range k {
			n++
			p.enqueue(newOutMsg(schemas.EventSubject("h"), "n", "h", n, payload, time.Now()))
		}
	}
	held := func() chan struct{} {
		back := make(chan struct{})
		go func() { p.hold(ctx); close(back) }()
		return back
	}
	wait := func(what string, c chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still held", what)
		}
	}
	ack := func(k int, err error) {
		for range k {
			answers <- err
		}
	}

	push(20) // under ahead: nothing is held
	wait("20 events waiting", held())
	push(20) // 40 wait, past ahead
	back := held()
	poll.Until(t, 30*time.Second, "the backend to be held with 40 events waiting", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.holding
	})
	ack(20, nil) // 20 wait, still past half of ahead (14)
	poll.Until(t, 30*time.Second, "20 acknowledgements to be taken", func() bool { return p.pending() == 20 })
	select {
	case <-back:
		t.Fatal("released with 20 events waiting, more than half of ahead")
	default:
	}
	ack(7, nil) // 13 wait
	wait("13 events waiting", back)
	p.mu.Lock()
	spilled := sp.count
	p.mu.Unlock()
	if spilled != 0 {
		t.Errorf("%d events spilled to disk while the stream took them", spilled)
	}

	// Storing fails: whoever is held goes on, and nobody is held while the
	// publisher retries.
	push(30) // 43 wait
	back = held()
	poll.Until(t, 30*time.Second, "the backend to be held with 43 events waiting", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.holding
	})
	answers <- errFlaky
	wait("a failed store", back)
	wait("while the publisher retries", held())

	// With the default memory tier, ahead is 4 MiB.
	if got := newPublisher(gate, none, 16, outboxLimits{Memory: 64 << 20}, nil, slog.New(slog.DiscardHandler)).ahead(); got != 4<<20 {
		t.Errorf("ahead with 64 MiB of memory: %d", got)
	}
}

// pacedSender stores each event delay after it is sent; while down,
// nothing leaves.
type pacedSender struct {
	down  *atomic.Bool
	delay time.Duration
}

type pacedFuture struct {
	msg *nats.Msg
	at  time.Time
}

func (f pacedFuture) wait() error    { time.Sleep(time.Until(f.at)); return nil }
func (f pacedFuture) Msg() *nats.Msg { return f.msg }

func (s pacedSender) send(msg *nats.Msg, _ bool) (future, error) {
	if s.down.Load() {
		return nil, errFlaky
	}
	return pacedFuture{msg, time.Now().Add(s.delay)}, nil
}
func (pacedSender) idle()    {}
func (pacedSender) restart() {}
func (pacedSender) close()   {}

// pacedPublisher runs a publisher on a pacedSender with a 64 KiB memory
// tier (ahead 32 KiB) and a spill file; push enqueues k events of about
// 1 KiB.
func pacedPublisher(t *testing.T, delay time.Duration) (p *publisher, sp *spill, down *atomic.Bool, push func(k int)) {
	sp, err := openSpill(filepath.Join(t.TempDir(), "outbox.spill"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.close)
	down = &atomic.Bool{}
	none := func(context.Context, []string) (map[string]uint64, error) { return map[string]uint64{}, nil }
	p = newPublisher(pacedSender{down, delay}, none, 16, outboxLimits{Memory: 64 << 10, Disk: 16 << 20}, sp, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	payload := []byte(strings.Repeat("x", 1000))
	n := uint64(0)
	push = func(k int) {
		for range k {
			n++
			p.enqueue(newOutMsg(schemas.EventSubject("h"), "n", "h", n, payload, time.Now()))
		}
	}
	return p, sp, down, push
}

// heldFor runs hold with a 30 s bound and fails if only the bound ended it.
func heldFor(t *testing.T, p *publisher, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p.hold(ctx)
	if ctx.Err() != nil {
		t.Fatalf("%s: held until the bound, nothing released it", what)
	}
}

// After an outage the backlog is the outbox's: nobody is held behind it
// (an agent's result or permission request would wait for all of it),
// until it is down to ahead; then a stream that falls behind holds again.
func TestPublisherHoldsNobodyBehindAnOutagesBacklog(t *testing.T) {
	p, _, down, push := pacedPublisher(t, 20*time.Millisecond) // about 800 events/s
	down.Store(true)
	push(1000) // about 1.1 MB wait: most on disk
	down.Store(false)
	poll.Until(t, 30*time.Second, "the publisher to store again", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.failed && !p.halted && !p.probing
	})
	p.hold(t.Context())
	if n := p.pending(); n < 500 {
		t.Errorf("held behind the outage's backlog until %d of its 1,000 events waited", n)
	}
	poll.Until(t, 30*time.Second, "the backlog to drain", func() bool { return p.pending() == 0 })
	push(40) // past ahead again, the stream behind
	p.mu.Lock()
	draining := p.draining
	p.mu.Unlock()
	if draining {
		t.Fatal("still draining once the backlog was stored")
	}
	heldFor(t, p, "40 events waiting, the stream storing them")
}

// Bytes the sender cannot reach (a disk tier that can no longer be read
// back) hold nobody: with nothing in memory to store, no acknowledgement
// would come to release them.
func TestPublisherHoldsNobodyWithNothingToStore(t *testing.T) {
	p, sp, down, push := pacedPublisher(t, 0)
	down.Store(true)
	push(300) // about 340 KB: most spilled
	p.mu.Lock()
	spilled := sp.count
	sp.f.Close() // the disk tier can no longer be read
	p.mu.Unlock()
	if spilled == 0 {
		t.Fatal("nothing spilled")
	}
	down.Store(false)
	poll.Until(t, 30*time.Second, "the memory tier to drain", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.queue) == 0 && p.inflight == 0 && !p.failed && !p.halted && !p.probing
	})
	p.mu.Lock()
	p.draining = false // as if the outage's backlog had been stored
	p.mu.Unlock()
	heldFor(t, p, "an unreadable spill")
}

// Every reader of agent.* sees the reply subject of a node's events,
// where JetStream acknowledges its fast batches: it was an inbox of the
// node's, and the fabric service answers any inbox a requester names
// (an observer's too), which the batch sender would take for the
// stream's word and begin its batch again. It is no inbox now.
func TestBatchesAreAcknowledgedWhereTheServiceNeverAnswers(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, _ := natstest.JetStream(t, b)
	watcher := natstest.Connect(t, b)
	events, err := watcher.SubscribeSync(schemas.EventSubject("seen"))
	if err != nil {
		t.Fatal(err)
	}
	watcher.Flush()
	bs, err := newBatchSender(nc, 16, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.close()
	f, err := bs.send(newOutMsg(schemas.EventSubject("seen"), "n", "seen", 1, []byte(`{"n":1}`), time.Now()).natsMsg(nil), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.wait(); err != nil {
		t.Fatalf("the event: %v", err)
	}
	got, err := events.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if service.IsInbox(got.Reply) || !strings.HasPrefix(got.Reply, schemas.BatchAckPrefix+".") {
		t.Errorf("a node's event carries the reply subject %q, which the fabric service would answer", got.Reply)
	}
}

// recordedPublisher runs a publisher whose sender tells each message it
// sends on out.sent and waits for an answer on answers; confined, it
// names each agent's last acknowledged event. stop ends it.
func recordedPublisher(t *testing.T, confined bool) (p *publisher, answers chan error, out recordingSender, stop func()) {
	t.Helper()
	answers = make(chan error)
	out = recordingSender{gatedSender{answers, make(chan struct{})}, make(chan *nats.Msg, 16)}
	none := func(context.Context, []string) (map[string]uint64, error) { return map[string]uint64{}, nil }
	p = newPublisher(out, none, 16, outboxLimits{Memory: 64 << 20}, nil, slog.New(slog.DiscardHandler))
	if confined {
		p.acked = map[string]uint64{}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	return p, answers, out, func() { cancel(); <-done }
}

// recordingSender is a gatedSender that tells each message it sends.
type recordingSender struct {
	gatedSender
	sent chan *nats.Msg
}

func (s recordingSender) send(msg *nats.Msg, alone bool) (future, error) {
	s.sent <- msg
	return s.gatedSender.send(msg, alone)
}

// A confined node names, with each event it sends its relay, the agent's
// last event before which it holds nothing of the agent: what it had
// acknowledged, or, when nothing of the agent waits, the number before
// the event (a restart takes up its journal's events first, in order).
// The relay takes it for where the numbering stands once the agent's
// events have aged out of the stream. A node with the fabric's rights
// sends no such header.
func TestPublisherNamesEachAgentsLastAcknowledgedEvent(t *testing.T) {
	for _, confined := range []bool{true, false} {
		p, answers, out, stop := recordedPublisher(t, confined)
		next := func(agent string, n uint64, want string) {
			t.Helper()
			p.enqueue(newOutMsg(schemas.EventSubject(agent), "n", agent, n, []byte(`{}`), time.Now()))
			select {
			case m := <-out.sent:
				if got := m.Header.Get(schemas.HeaderAcked); got != want || m.Header.Get(schemas.HeaderMsgID) != schemas.MsgID(agent, n) {
					t.Errorf("confined %v: event %s is sent naming %s %q; want %q", confined, m.Header.Get(schemas.HeaderMsgID), schemas.HeaderAcked, got, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("event %d of %s was not sent", n, agent)
			}
		}
		claim := func(s string) string {
			if !confined {
				return ""
			}
			return s
		}
		next("a", 1, claim("0"))
		next("a", 2, claim("0")) // 1 not acknowledged yet
		answers <- nil
		answers <- nil
		poll.Until(t, 30*time.Second, "two acknowledgements taken", func() bool { return p.pending() == 0 })
		next("a", 3, claim("2"))
		next("a", 4, claim("2"))
		// Another agent's first event after a restart: nothing of it waits.
		next("b", 41, claim("40"))
		answers <- nil
		poll.Until(t, 30*time.Second, "event 3's acknowledgement taken", func() bool { return p.pending() == 2 })
		next("a", 5, claim("3"))
		stop()
	}
}

// A dead agent dropped from the node's memory (MaxDead) while its last
// events still wait keeps its word: forget deleted it, and the waiting
// event went again naming 0, "nothing of it is stored", which a relay
// taking the node's word (the agent's events aged out, the coordinator
// restarted) answers "send 1 first" for ever, holding up every agent's
// events behind it.
func TestPublisherKeepsTheWordOfAForgottenAgentWhoseEventsWait(t *testing.T) {
	p, answers, out, stop := recordedPublisher(t, true)
	defer stop()
	sent := func() *nats.Msg {
		t.Helper()
		select {
		case m := <-out.sent:
			return m
		case <-time.After(30 * time.Second):
			t.Fatal("nothing was sent")
			return nil
		}
	}
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 4, []byte(`{}`), time.Now()))
	sent()
	answers <- nil // event 4 stored
	poll.Until(t, 30*time.Second, "event 4's acknowledgement taken", func() bool { return p.pending() == 0 })
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 5, []byte(`{}`), time.Now()))
	if m := sent(); m.Header.Get(schemas.HeaderAcked) != "4" {
		t.Fatalf("event 5 names %q", m.Header.Get(schemas.HeaderAcked))
	}
	p.forget("a") // dead and dropped while event 5 waits
	answers <- &jetstream.APIError{Code: 503, Description: "the relay could not decide it now"}
	if got := sent().Header.Get(schemas.HeaderAcked); got != "4" {
		t.Errorf("event 5, sent again after the agent was forgotten, names %s %q; event 4 was acknowledged", schemas.HeaderAcked, got)
	}
	answers <- nil
	poll.Until(t, 30*time.Second, "event 5 stored", func() bool { return p.pending() == 0 })
	p.forget("a")
	p.mu.Lock()
	_, kept := p.acked["a"]
	p.mu.Unlock()
	if kept {
		t.Error("the word of a forgotten agent with nothing waiting is kept")
	}
}

// A relay of an earlier version (a cluster's server not yet upgraded, a
// coordinator rolled back after the node's hello) refuses an event
// carrying the node's word, for good: the node dropped it and every event
// after it. It sends them again without the word.
func TestPublisherStopsNamingItsWordToARelayThatRefusesIt(t *testing.T) {
	p, answers, out, stop := recordedPublisher(t, true)
	defer stop()
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 1, []byte(`{}`), time.Now()))
	for i, want := range []string{"0", ""} {
		select {
		case m := <-out.sent:
			if got := m.Header.Get(schemas.HeaderAcked); got != want || m.Header.Get(schemas.HeaderMsgID) != schemas.MsgID("a", 1) {
				t.Fatalf("send %d is %s naming %q; want event 1 naming %q", i+1, m.Header.Get(schemas.HeaderMsgID), got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("send %d: event 1 was not sent (again)", i+1)
		}
		if i == 0 {
			answers <- &jetstream.APIError{Code: schemas.RelayRefused, Description: "header Shoal-Acked may not be set by a node"}
		}
	}
	answers <- nil
	poll.Until(t, 30*time.Second, "event 1 stored", func() bool { return p.pending() == 0 })
}

// A streak of failed stores is one warning, then one in a while: a node
// whose fabric was away for half a minute logged some sixty lines (a new
// user's walkthrough counted them), every retry's.
func TestPublisherWarnsOnceForAStreakOfFailedStores(t *testing.T) {
	var log bytes.Buffer
	answers := make(chan error)
	out := recordingSender{gatedSender{answers, make(chan struct{})}, make(chan *nats.Msg, 16)}
	none := func(context.Context, []string) (map[string]uint64, error) { return map[string]uint64{}, nil }
	p := newPublisher(out, none, 16, outboxLimits{Memory: 64 << 20}, nil, slog.New(slog.NewTextHandler(&syncWriter{w: &log}, nil)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 1, []byte(`{}`), time.Now()))
	for range 5 { // five tries fail, 50 ms to 800 ms apart
		select {
		case <-out.sent:
		case <-time.After(30 * time.Second):
			t.Fatal("event 1 was not sent (again)")
		}
		answers <- errFlaky
	}
	<-out.sent
	answers <- nil
	poll.Until(t, 30*time.Second, "event 1 stored", func() bool { return p.pending() == 0 })
	cancel()
	<-done
	if n := strings.Count(log.String(), "storing events failed; retrying"); n != 1 {
		t.Errorf("five failed stores in a row logged %d warnings; want the streak's first:\n%s", n, log.String())
	}
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// A node's events go only while its heartbeat entry is sure to live
// (its lease): once it lapses (the node was cut off, or stopped, past its
// TTL) nothing more is sent, and a beat written after the lapse renews
// nothing, until the host has asked whether its agents are still its own.
// The events of an agent the fabric took for lost meanwhile are dropped
// unsent; a later life of the id, and the other agents, go on.
func TestPublisherSendsNothingPastItsLeaseUntilTheHostChecks(t *testing.T) {
	p, answers, out, stop := recordedPublisher(t, false)
	defer stop()
	lapses := lapsesOf(p)
	enqueue := func(agent string, n uint64) {
		p.enqueue(newOutMsg(schemas.EventSubject(agent), "n", agent, n, []byte(`{}`), time.Now()))
	}
	sent := func(want string) {
		t.Helper()
		select {
		case m := <-out.sent:
			if got := m.Header.Get(schemas.HeaderMsgID); got != want {
				t.Fatalf("sent %s, want %s", got, want)
			}
			answers <- nil
		case <-time.After(30 * time.Second):
			t.Fatalf("%s was not sent", want)
		}
	}
	nothingSent := func(when string) {
		t.Helper()
		select {
		case m := <-out.sent:
			t.Fatalf("%s: sent %s", when, m.Header.Get(schemas.HeaderMsgID))
		case <-time.After(200 * time.Millisecond):
		}
	}
	now := time.Now()
	p.extend(now.Add(time.Hour))
	enqueue("a", 1)
	sent(schemas.MsgID("a", 1))

	// The lease ran out (a beat began an hour ago, none since).
	p.mu.Lock()
	p.lease = now.Add(-time.Minute)
	p.mu.Unlock()
	enqueue("a", 2)
	enqueue("a", 3)
	select {
	case <-lapses:
	case <-time.After(30 * time.Second):
		t.Fatal("the host was not told of the lapse")
	}
	nothingSent("lapsed")
	p.extend(time.Now().Add(time.Hour)) // a beat after the lapse
	enqueue("b", 1)
	nothingSent("after a beat that began past the lease")

	// The host found a taken for lost: its events up to 3 go nowhere.
	p.drop("a", 3)
	p.resume(time.Now().Add(time.Hour))
	sent(schemas.MsgID("b", 1))
	enqueue("a", 4) // the id's next life
	sent(schemas.MsgID("a", 4))
	if err := p.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
}
