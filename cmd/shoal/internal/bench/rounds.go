package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// watcher is the core subscriber of the agents' events: it times each
// delta from its print, finds each round's first print and last result,
// counts the round's events, and keeps the first agent's envelopes of the
// first round for the raw baseline to publish.
type watcher struct {
	sub       *nats.Subscription
	byChannel map[string]*agent // "agent:<id>", as the bus names it
	first     string            // the agent whose envelopes are kept

	core, bus samples

	results      atomic.Int64
	events       atomic.Int64
	firstPrinted atomic.Int64
	lastResult   atomic.Int64
	roundEvents  int64 // events when the round began

	mu       sync.Mutex
	keep     bool
	envelope [][]byte
}

func watch(ctx context.Context, obs *nats.Conn, agents []*agent) (*watcher, error) {
	w := &watcher{byChannel: make(map[string]*agent, len(agents)), first: agents[0].id, keep: true}
	bySubject := make(map[string]*agent, len(agents))
	for _, a := range agents {
		bySubject[schemas.EventSubject(a.id)] = a
		w.byChannel["agent:"+a.id] = a
	}
	sub, err := obs.Subscribe(schemas.EventSubjects, func(m *nats.Msg) {
		a := bySubject[m.Subject]
		if a == nil {
			return
		}
		now := time.Now().UnixNano()
		w.events.Add(1)
		if a.id == w.first {
			w.mu.Lock()
			if w.keep {
				w.envelope = append(w.envelope, m.Data)
			}
			w.mu.Unlock()
		}
		if _, printed, ok := stamp(m.Data); ok {
			w.core.add(now - printed)
			for {
				old := w.firstPrinted.Load()
				if (old != 0 && old <= printed) || w.firstPrinted.CompareAndSwap(old, printed) {
					break
				}
			}
			return
		}
		if bytes.HasPrefix(m.Data, []byte(`{"kind":"result"`)) {
			w.results.Add(1)
			w.lastResult.Store(now)
		}
	})
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, -1)
	if err := obs.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	w.sub = sub
	return w, nil
}

func (w *watcher) stop() { w.sub.Unsubscribe() }

// beginRound starts timing a round of turns.
func (w *watcher) beginRound() {
	w.firstPrinted.Store(0)
	w.roundEvents = w.events.Load()
}

// endRound is how long the round took, from its first delta printed to
// its last result seen, and how many events it brought. The first
// round's envelopes are kept from then on.
func (w *watcher) endRound() (time.Duration, int64) {
	w.mu.Lock()
	w.keep = false
	w.mu.Unlock()
	first, last := w.firstPrinted.Load(), w.lastResult.Load()
	if first == 0 || last <= first {
		return 0, 0
	}
	return time.Duration(last - first), w.events.Load() - w.roundEvents
}

// captured is the first agent's envelopes of the first round.
func (w *watcher) captured() [][]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.envelope
}

// follower is a following replay of some agents, timing each delta from
// its print, until it has seen every turn's result.
type follower struct {
	lat     samples
	done    chan error
	cancel  context.CancelFunc
	results atomic.Int64
	want    int64
}

func followReplay(ctx context.Context, f client.Client, ids []string, turns int) (*follower, error) {
	ctx, cancel := context.WithCancel(ctx)
	fl := &follower{done: make(chan error, 1), cancel: cancel, want: int64(len(ids) * turns)}
	started := make(chan struct{})
	var once sync.Once
	go func() {
		fl.done <- f.Replay(ctx, ids, client.From{}, true, func(r client.Replayed, g *client.Gap) error {
			once.Do(func() { close(started) })
			if g != nil {
				return nil // the verification reports it
			}
			if r.Delta {
				if _, printed, ok := stamp(r.Raw); ok {
					fl.lat.add(time.Now().UnixNano() - printed)
				}
				return nil
			}
			if r.Kind == schemas.KindResult && fl.results.Add(1) == fl.want {
				return errDone
			}
			return nil
		})
	}()
	select {
	case <-started:
		return fl, nil
	case err := <-fl.done:
		cancel()
		return nil, fmt.Errorf("the following replay ended before the turns: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("the following replay delivered nothing in 30s")
	}
}

// wait waits for the replay to have seen every result.
func (fl *follower) wait() error {
	select {
	case err := <-fl.done:
		fl.done <- err
		if err != nil && !errors.Is(err, errDone) {
			return fmt.Errorf("the following replay: %w", err)
		}
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("the following replay saw %d of %d results a minute after the core subscriber had them all", fl.results.Load(), fl.want)
	}
}

func (fl *follower) stop() { fl.cancel() }

// Anchor is one way of publishing the same envelopes straight to
// JetStream, measured beside the node in the same run, as nats bench's
// publishers publish: `nats bench js pub async` (without and with
// --dedup) and `nats bench js pub fast`.
type Anchor string

// The anchors.
const (
	// AnchorAsync is an asynchronous publish per event, no message id.
	AnchorAsync Anchor = "JetStream async publish"
	// AnchorAsyncDedup is the same with the node's three headers, the
	// message id among them (nats bench --dedup).
	AnchorAsyncDedup Anchor = "JetStream async publish, message ids"
	// AnchorFast is fast batch publishing (orbit.go's jetstreamext, as
	// nats bench js pub fast uses), no message id.
	AnchorFast Anchor = "JetStream fast batch"
	// AnchorFastDedup is the same with the node's three headers, the
	// message id among them.
	AnchorFastDedup Anchor = "JetStream fast batch, message ids"
)

// AnchorFloor is the floor (floor.go): the same stand-ins as the node's,
// each line published straight to JetStream the node's way, under the
// node's three headers. It is not among Anchors: its rate is measured in
// the bare rounds only, from the turns sent to the last acknowledgement.
const AnchorFloor Anchor = "the floor: the same stand-ins, straight to JetStream"

// Anchors are the anchors a run measures, in the order printed.
var Anchors = []Anchor{AnchorAsync, AnchorAsyncDedup, AnchorFast, AnchorFastDedup}

// dedup says whether an anchor's events carry a message id.
func (a Anchor) dedup() bool { return a == AnchorAsyncDedup || a == AnchorFastDedup }

// fast says whether an anchor publishes in fast batches.
func (a Anchor) fast() bool { return a == AnchorFast || a == AnchorFastDedup }

// rawBaseline publishes envelopes straight to JetStream, one of the
// anchors' ways, to an agent subject of its own, watched as the node's
// agents are: by a core subscriber, the live bus and a following replay.
type rawBaseline struct {
	way    Anchor
	conn   *nats.Conn
	js     jetstream.JetStream
	sub    *nats.Subscription
	id     string
	node   string
	next   int // the number of the next message
	seen   atomic.Int64
	replay chan error
	cancel context.CancelFunc
	bare   bool // nobody watches it: a publish ends with its acknowledgements
}

// dialBaseline connects an anchor's publisher of its own, to publish as
// node to an agent subject of its own.
func dialBaseline(url string, way Anchor, node, kind string) (*rawBaseline, error) {
	pc, err := nats.Connect(url, nats.Name("shoal bench "+kind+" publisher: "+string(way)))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(pc, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		pc.Close()
		return nil, err
	}
	return &rawBaseline{way: way, conn: pc, js: js, id: fmt.Sprintf("bench-%s-%d-%d", kind, os.Getpid(), time.Now().UnixNano()), node: node, next: 1}, nil
}

func newRawBaseline(ctx context.Context, way Anchor, url, node string, obs *nats.Conn, f client.Client) (*rawBaseline, error) {
	r, err := dialBaseline(url, way, node, "raw")
	if err != nil {
		return nil, err
	}
	r.replay = make(chan error, 1)
	pc, js := r.conn, r.js
	r.sub, err = obs.Subscribe(schemas.EventSubject(r.id), func(*nats.Msg) { r.seen.Add(1) })
	if err != nil {
		pc.Close()
		return nil, err
	}
	r.sub.SetPendingLimits(-1, -1)
	if err := obs.Flush(); err != nil {
		r.close()
		return nil, err
	}
	// One is stored before anything is timed, so the replay has an agent
	// to follow (a replay refuses one the fabric does not know).
	// It carries a number even for the anchors whose later events have
	// none (the replay delivers them as strays, and watches them all the
	// same).
	seed := r.msg([]byte(`{"kind":"status","turn":0,"data":{"status":"idle"}}`))
	seed.Header[schemas.HeaderMsgID] = []string{schemas.MsgID(r.id, 1)}
	if _, err := js.PublishMsg(ctx, seed); err != nil {
		r.close()
		return nil, fmt.Errorf("raw publish: %w", err)
	}
	var replayed atomic.Int64
	replayCtx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go func() {
		r.replay <- f.Replay(replayCtx, []string{r.id}, client.From{}, true, func(client.Replayed, *client.Gap) error {
			replayed.Add(1)
			return nil
		})
	}()
	if err := waitFor(ctx, func() int64 {
		select {
		case err := <-r.replay:
			r.replay <- err
			return -1
		default:
			return replayed.Load()
		}
	}, 1, func() string { return "the raw baseline's following replay delivered nothing" }); err != nil {
		r.close()
		return nil, err
	}
	select {
	case err := <-r.replay:
		r.close()
		return nil, fmt.Errorf("the raw baseline's following replay: %w", err)
	default:
	}
	if err := waitFor(ctx, r.seen.Load, 1, func() string { return "the raw baseline's core subscriber saw nothing" }); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// msg is the next raw message, with the node's headers (the message id
// only for the anchors that dedup).
func (r *rawBaseline) msg(data []byte) *nats.Msg {
	m := nats.NewMsg(schemas.EventSubject(r.id))
	m.Data = data
	if r.way.dedup() {
		m.Header[schemas.HeaderMsgID] = []string{schemas.MsgID(r.id, uint64(r.next))}
	}
	m.Header[schemas.HeaderNode] = []string{r.node}
	m.Header[schemas.HeaderTime] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
	r.next++
	return m
}

// publish publishes n envelopes, cycling through envelopes, and returns
// how long it took until the core subscriber had seen them all.
func (r *rawBaseline) publish(ctx context.Context, envelopes [][]byte, n int) (time.Duration, error) {
	if len(envelopes) == 0 || n == 0 {
		return 0, errors.New("no envelopes to publish raw")
	}
	want := r.seen.Load() + int64(n)
	start := time.Now()
	if r.way.fast() {
		if err := r.publishFast(ctx, envelopes, n); err != nil {
			return 0, err
		}
	} else {
		for i := range n {
			// A full window waits for acknowledgements as long as it takes,
			// as the node's publisher does, rather than the default 200ms.
			if _, err := r.js.PublishMsgAsync(r.msg(envelopes[i%len(envelopes)]), jetstream.WithStallWait(time.Minute)); err != nil {
				return 0, fmt.Errorf("raw publish: %w", err)
			}
		}
		select {
		case <-r.js.PublishAsyncComplete():
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Minute):
			return 0, errors.New("raw publishes not acknowledged in 5 minutes")
		}
	}
	if r.bare {
		return time.Since(start), nil
	}
	if err := waitFor(ctx, r.seen.Load, want, func() string {
		return fmt.Sprintf("the core subscriber saw %d of %d raw publishes", r.seen.Load()-(want-int64(n)), n)
	}); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// publishFast publishes n envelopes in one fast batch and ends it.
func (r *rawBaseline) publishFast(ctx context.Context, envelopes [][]byte, n int) error {
	b, err := newFastBatch(r.js)
	if err != nil {
		return fmt.Errorf("raw fast batch: %w", err)
	}
	for i := range n {
		if err := b.add(r.msg(envelopes[i%len(envelopes)])); err != nil {
			return fmt.Errorf("raw fast batch: %w", err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := b.end(cctx); err != nil {
		return fmt.Errorf("raw %w", err)
	}
	return nil
}

// fastBatch is a fast batch published as nats bench js pub fast
// publishes one (a flow of 500, one outstanding acknowledgement), its
// first failure kept.
type fastBatch struct {
	fp     jetstreamext.FastPublisher
	failed atomic.Value
}

func newFastBatch(js jetstream.JetStream) (*fastBatch, error) {
	b := &fastBatch{}
	fp, err := jetstreamext.NewFastPublisher(js, jetstreamext.FastPublishFlowControl{Flow: 500, MaxOutstandingAcks: 1, AckTimeout: time.Minute},
		jetstreamext.WithFastPublisherErrorHandler(func(err error) { b.failed.CompareAndSwap(nil, err) }))
	if err != nil {
		return nil, err
	}
	b.fp = fp
	return b, nil
}

func (b *fastBatch) add(m *nats.Msg) error {
	_, err := b.fp.AddMsg(m)
	return err
}

// end commits the batch and waits for its acknowledgement; an error if
// any of it failed.
func (b *fastBatch) end(ctx context.Context) error {
	if _, err := b.fp.Close(ctx); err != nil {
		return fmt.Errorf("fast batch, its end: %w", err)
	}
	if err, _ := b.failed.Load().(error); err != nil {
		return fmt.Errorf("fast batch: %w", err)
	}
	return nil
}

func (r *rawBaseline) close() {
	if r.cancel != nil {
		r.cancel()
		<-r.replay
	}
	if r.sub != nil {
		r.sub.Unsubscribe()
	}
	r.conn.Close()
}
