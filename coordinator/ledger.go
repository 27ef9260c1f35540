package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// LedgerConfig configures the spend ledger.
type LedgerConfig struct {
	Conn *nats.Conn
	// Flush is how often the count is written when it moved only past
	// events other than results (a counted turn is written at once);
	// 100 ms when zero.
	Flush  time.Duration
	Logger *slog.Logger
}

// Ledger counts what the fleet's turns used, from the AGENTS stream: the
// usage of every result event, by the node that ran the turn, the labels
// it carried then and the agent's model (schemas.Spent). The count and
// the stream sequence it reaches are written together to SpentKey of
// BudgetsBucket, with a compare-and-set, so a restarted coordinator goes
// on from where the written count ends and counts no turn twice and none
// not at all; the nodes read it when they start a turn, against the
// fleet's and the labels' budgets. Several coordinators may run one each:
// they count the same stream, and the one behind takes the other's count.
type Ledger struct {
	cfg       LedgerConfig
	log       *slog.Logger
	js        jetstream.JetStream
	ready     chan struct{}
	readyOnce sync.Once

	mu        sync.Mutex
	spent     schemas.Spent       // counted, written or not
	labels    map[string][]string // each node's labels as last heard
	instances map[string]string   // each node's life as last heard
	models    map[string]string   // each agent's model as its record says
	results   schemas.TurnResults // a turn closed for a lost node counts once
	counted   chan struct{}       // a turn was counted: write soon
}

// NewLedger checks cfg.
func NewLedger(cfg LedgerConfig) (*Ledger, error) {
	if cfg.Conn == nil {
		return nil, errors.New("the ledger needs a NATS connection")
	}
	if cfg.Flush <= 0 {
		cfg.Flush = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, log: cfg.Logger.With("component", "ledger"), js: js, ready: make(chan struct{}),
		labels: map[string][]string{}, instances: map[string]string{}, models: map[string]string{},
		counted: make(chan struct{}, 1)}, nil
}

// Ready is closed once the ledger runs (the count itself may take a
// moment to read).
func (l *Ledger) Ready() <-chan struct{} { return l.ready }

// Spent is the count as it stands (written or about to be).
func (l *Ledger) Spent() schemas.Spent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spentLocked()
}

func (l *Ledger) spentLocked() schemas.Spent {
	out := schemas.Spent{Seq: l.spent.Seq, Rows: make([]schemas.SpentRow, len(l.spent.Rows))}
	copy(out.Rows, l.spent.Rows)
	return out
}

// progressEvery is how often a count that only moved past events other
// than results is written: a restart then reads less of the stream again.
const progressEvery = 5 * time.Second

// Run counts until ctx ends. A read that fails (the stream's leader
// being elected, the server away) is begun again from the written count,
// after a pause: the ledger stops only with ctx.
func (l *Ledger) Run(ctx context.Context) error {
	// Nobody waits on the count: the coordinator's other services start
	// beside it whatever the stream's state.
	l.readyOnce.Do(func() { close(l.ready) })
	pause := 100 * time.Millisecond
	for {
		began := time.Now()
		err := l.run(ctx)
		if ctx.Err() != nil {
			return nil // stopped, whatever it was doing
		}
		if time.Since(began) > time.Minute {
			pause = 100 * time.Millisecond
		}
		l.log.Warn("counting the spend stopped; it begins again from the count written", "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

func (l *Ledger) run(ctx context.Context) error {
	kv, err := l.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.BudgetsBucket, err)
	}
	agents, err := l.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	nodes, err := l.js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	rev, err := l.load(ctx, kv)
	if err != nil {
		return err
	}
	w, err := client.WatchAllKeys(ctx, l.cfg.Conn, nodes)
	if err != nil {
		return fmt.Errorf("watch KV bucket %s: %w", schemas.NodesBucket, err)
	}
	defer w.Stop()
	if err := l.watchNodes(ctx, w); err != nil { // the nodes there now, before any turn is counted
		return err
	}
	stream, err := l.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	// One attempt at each read's consumer: nats.go's ordered consumer
	// otherwise tries to make it again forever, whatever ctx says, and a
	// coordinator whose server is away could not be stopped. A failed
	// read begins again from the written count (Run), minding ctx.
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, MaxResetAttempts: 1}
	if l.spent.Seq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, l.spent.Seq+1
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", schemas.StreamName, err)
	}
	var workers sync.WaitGroup
	defer workers.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the wait: the workers end with it
	workers.Go(func() { l.flushLoop(ctx, kv, rev) })
	workers.Go(func() { l.followNodes(ctx, w) })
	// The stream is read in batches, what it holds at each read, and at
	// most every ledgerPace while it holds less than a batch: the server
	// sends the ledger many events at once rather than each as it stores
	// it, which would cost the stream's leader, the fleet's ceiling, as
	// much as a second writer.
	pause := ledgerPace
	for {
		batch, err := cons.FetchNoWait(ledgerBatch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read stream %s: %w", schemas.StreamName, err)
		}
		n := 0
		for m := range batch.Messages() {
			l.count(ctx, agents, m)
			n++
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read stream %s: %w", schemas.StreamName, err)
		}
		// Nothing stored: the pause doubles, up to ledgerIdle. Every read
		// of nats.go's ordered consumer deletes and makes its consumer
		// again, a few JetStream requests of the stream's leader each, and
		// at ledgerPace an idle coordinator asked some 180 a second. A
		// turn's deltas come before its result, so the pace is back to
		// ledgerPace by the time a result is there to count.
		switch {
		case n == 0:
			pause = min(2*pause, ledgerIdle)
		default:
			pause = ledgerPace
		}
		if n < ledgerBatch {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
		}
	}
}

// ledgerBatch and ledgerPace are how the ledger reads the stream: this
// many events at a time, and a pause this long after reading fewer.
const (
	ledgerBatch = 4096
	ledgerPace  = 10 * time.Millisecond
	// ledgerIdle is the longest pause, after reads that found nothing.
	ledgerIdle = 250 * time.Millisecond
)

// load reads the written count; its revision is 0 when there is none.
func (l *Ledger) load(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	e, err := kv.Get(ctx, schemas.SpentKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s of %s: %w", schemas.SpentKey, schemas.BudgetsBucket, err)
	}
	var s schemas.Spent
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		// Written by a ledger of an earlier version, which wrote what
		// failed to encode: the count begins again from the stream's
		// start and is written over. What the stream no longer holds (past
		// its age or size) is not counted again: the fleet's count may
		// come out lower than it was, never higher.
		l.log.Error("the spend count written does not decode; counting again from the stream's start", "key", schemas.SpentKey, "err", err)
		s = schemas.Spent{}
	}
	l.mu.Lock()
	l.spent = s
	for node, life := range l.instances { // as heard before a new start
		l.spent.Retire(node, life)
	}
	l.mu.Unlock()
	return e.Revision(), nil
}

// watchNodes takes the node entries the watch holds now, up to its
// marker.
func (l *Ledger) watchNodes(ctx context.Context, w jetstream.KeyWatcher) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the node watch ended")
			}
			if e == nil {
				return nil
			}
			l.heard(e)
		}
	}
}

// followNodes keeps each node's labels as it last advertised them.
func (l *Ledger) followNodes(ctx context.Context, w jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e != nil {
				l.heard(e)
			}
		}
	}
}

func (l *Ledger) heard(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		return // a node gone keeps the labels it had
	}
	var rec schemas.NodeRecord
	if json.Unmarshal(e.Value(), &rec) != nil {
		return
	}
	node := e.Key()
	labels := schemas.LabelsOf(rec.Labels)
	if err := schemas.ValidNodeLabels(rec.Labels); err != nil {
		// Each label set is a row of the count, one value of the bucket.
		l.log.Warn("a node's labels are not counted", "node", node, "err", err)
		labels = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.labels[node] = labels
	if l.instances[node] != rec.Instance {
		// A new life: the rows of the ones before it no longer stand
		// apart.
		l.instances[node] = rec.Instance
		l.spent.Retire(node, rec.Instance)
	}
}

// count counts m if it is a turn's result: one of an agent's events (its
// subject and number agree), with usage.
func (l *Ledger) count(ctx context.Context, agents jetstream.KeyValue, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return
	}
	seq := meta.Sequence.Stream
	l.mu.Lock()
	behind := seq <= l.spent.Seq // a count another coordinator wrote is further on
	l.mu.Unlock()
	if behind {
		return
	}
	var u *schemas.Usage
	var turn int
	result := false
	id, ok := schemas.AgentFromSubject(m.Subject())
	if ok {
		var kind schemas.Kind
		if kind, turn, _, err = schemas.Peek(m.Data()); err == nil && kind == schemas.KindResult {
			result = true
			if agent, _, err := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID)); err == nil && agent == id {
				ev, err := schemas.Decode(m.Data())
				if err != nil {
					// The relay refuses such a result; a node with the
					// fabric's rights may still store one.
					l.log.Warn("a result is not counted", "agent", id, "seq", seq, "err", err)
				} else if r, ok := ev.Payload.(schemas.Result); ok {
					u = r.Usage
				}
			}
		}
	}
	var model string
	if u != nil {
		model = l.model(ctx, agents, id)
	}
	node := m.Headers().Get(schemas.HeaderNode)
	ran := schemas.RanOn(node, m.Headers().Get(schemas.HeaderClosedFor))
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq <= l.spent.Seq {
		return
	}
	l.spent.Seq = seq
	more := false
	if result {
		if u, more = l.results.Take(id, node, turn, u); more {
			l.log.Warn("a turn the coordinator closed had its own result stored after: only what it used beyond the closing's is counted",
				"agent", id, "turn", turn, "node", node)
		}
	}
	if u != nil {
		if more {
			l.spent.AddMore(ran, l.instances[ran], model, l.labels[ran], *u)
		} else {
			l.spent.Add(ran, l.instances[ran], model, l.labels[ran], *u)
		}
		select {
		case l.counted <- struct{}{}:
		default:
		}
	}
}

// model is agent id's model as its record says, "unknown" when it has
// none left; it is read once per agent.
func (l *Ledger) model(ctx context.Context, agents jetstream.KeyValue, id string) string {
	l.mu.Lock()
	m, ok := l.models[id]
	l.mu.Unlock()
	if ok {
		return m
	}
	m = "unknown"
	if e, err := agents.Get(ctx, id); err == nil {
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) == nil && rec.Model != "" && len(rec.Model) <= maxModelName {
			m = rec.Model
		}
	}
	l.mu.Lock()
	l.models[id] = m
	l.mu.Unlock()
	return m
}

// maxModelName bounds a model's name as a row of the count names it; a
// longer one is counted as "unknown".
const maxModelName = 128

// flushLoop writes the count as soon as a turn is counted (one write at a
// time: what is counted meanwhile goes in the next), and the stream
// position it reached now and then, until ctx ends (then once more).
func (l *Ledger) flushLoop(ctx context.Context, kv jetstream.KeyValue, rev uint64) {
	t := time.NewTicker(l.cfg.Flush)
	defer t.Stop()
	written := l.Spent()
	lastWrite := time.Now()
	var failedSaid time.Time // when a write that failed for another reason than a newer write was last logged
	flush := func(ctx context.Context) {
		now := l.Spent()
		turns := func(s schemas.Spent) (n int64) {
			for _, r := range s.Rows {
				n += r.Turns
			}
			return n
		}
		if now.Seq == written.Seq || (turns(now) == turns(written) && time.Since(lastWrite) < progressEvery) {
			return
		}
		b, err := json.Marshal(now)
		if err != nil {
			// Never written: the value written stands, and every node's
			// allowance with it.
			l.log.Error("the spend count does not encode; the one written stands", "err", err)
			return
		}
		if rev == 0 {
			rev, err = kv.Create(ctx, schemas.SpentKey, b)
		} else {
			rev, err = kv.Update(ctx, schemas.SpentKey, b, rev)
		}
		if err == nil {
			written, lastWrite = now, time.Now()
			return
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			// Not another coordinator's write (a count past the server's
			// payload limit, say): said, once a minute, for as long as
			// it lasts, since nodes then see no turn counted.
			if time.Since(failedSaid) >= time.Minute {
				failedSaid = time.Now()
				l.log.Error("cannot write the spend count; nodes see no turn counted until it is", "err", err, "bytes", len(b), "rows", len(now.Rows))
			}
		}
		// Another coordinator wrote: the count that reaches further on
		// the stream stands.
		e, gerr := kv.Get(ctx, schemas.SpentKey)
		if gerr != nil {
			l.log.Warn("cannot write the spend count", "err", err)
			return
		}
		var theirs schemas.Spent
		if json.Unmarshal(e.Value(), &theirs) != nil {
			l.log.Warn("the spend count written does not decode; it is written over")
			rev = e.Revision()
			return
		}
		rev = e.Revision()
		l.mu.Lock()
		if theirs.Seq >= l.spent.Seq {
			l.spent = theirs
			for node, life := range l.instances {
				l.spent.Retire(node, life)
			}
			written = l.spentLocked() // a copy: the count goes on in l.spent
		} else {
			written = schemas.Spent{Seq: theirs.Seq} // ours, further on, is written next
		}
		l.mu.Unlock()
	}
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			flush(fctx)
			cancel()
			return
		case <-l.counted:
			flush(ctx)
		case <-t.C:
			flush(ctx)
		}
	}
}
