package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// records keeps each agent's KV record up to date. Writes are
// compare-and-set on the key's revision, so the node never overwrites a
// newer record someone else wrote (the coordinator marking a lost node's
// agents dead). Transitions are written at once; activity alone at most
// once a second.
type records struct {
	kv   store
	node string
	log  *slog.Logger

	mu     sync.Mutex
	dirty  map[string]*agent
	urgent bool
	rev    map[string]uint64 // last revision written or read, per agent
	lost   map[string]bool   // agents whose record another owner holds
	life   map[string]*agent // the life of each id that owns its record
	// ending holds the lives of opens that failed whose claims are to be
	// written dead (giveBack): once written, the node forgets them.
	ending map[string]*agent
	wake   chan struct{}
	// failing says the last pass failed to write some record, and warned
	// when that was last logged.
	failing bool
	warned  time.Time
	// abandon is told about an agent the fabric has declared dead while
	// this node still ran it (the node was cut off and taken for lost).
	abandon func(ctx context.Context, id string)
	work    sync.WaitGroup
}

func newRecords(kv store, node string, log *slog.Logger, abandon func(context.Context, string)) *records {
	return &records{kv: kv, node: node, log: log, dirty: map[string]*agent{}, rev: map[string]uint64{},
		lost: map[string]bool{}, life: map[string]*agent{}, ending: map[string]*agent{}, wake: make(chan struct{}, 1), abandon: abandon}
}

// claim takes the key of a new or reopened agent. The coordinator (a
// client placing the agent) claims it first: its record names this node
// and the open's request id, status starting, and the node takes it up.
// A node with the fabric's full rights, asked directly, may claim for
// itself: create-only, or over a dead record, or over a stale one this
// node left when it crashed. A confined node may not (the relay refuses
// it). It returns a conflict error naming the owner when the id is live
// elsewhere, and a release that gives the claim up if the open cannot
// even begin: a new key is deleted, any other is dead again.
func (r *records) claim(ctx context.Context, a *agent) (release func(context.Context), err error) {
	// Under the agent's lock: reserved, the agent answers a status (which
	// writes its numbering into its record) while it is claimed.
	a.mu.Lock()
	rec := a.rec
	a.mu.Unlock()
	val := encodeRecord(rec)
	// From here on only this life writes the id's record: a write still
	// pending for a previous life (its death) must not land on this one.
	r.mu.Lock()
	r.life[rec.ID] = a
	if d := r.dirty[rec.ID]; d != nil && d != a {
		delete(r.dirty, rec.ID)
	}
	r.mu.Unlock()
	for try := 0; ; try++ {
		release, again, err := r.claimOnce(ctx, a, rec, val)
		if !again || try >= 3 {
			return release, err
		}
	}
}

// claimOnce is one try of claim; again says the record changed between
// its read and its write, so another try may succeed.
func (r *records) claimOnce(ctx context.Context, a *agent, rec schemas.AgentRecord, val []byte) (release func(context.Context), again bool, err error) {
	e, err := r.kv.get(ctx, rec.ID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := r.kv.create(ctx, rec.ID, val)
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			return nil, true, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (its record changed while opening)", rec.ID)
		case err != nil:
			return nil, false, claimErr(rec, err)
		}
		r.setRev(rec.ID, rev)
		return func(ctx context.Context) { r.giveBack(ctx, a, rev, nil) }, false, nil
	case err != nil:
		return nil, false, schemas.Errf(schemas.CodeUnavailable, "read the agent's record: %v", err)
	}
	old, err := decodeRecord(e.value)
	granted := err == nil && old.Node == r.node && old.Status == schemas.StatusStarting && old.RequestID == rec.RequestID
	if !granted && err == nil && old.Status != schemas.StatusDead && old.Node != r.node {
		return nil, false, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (on node %s)", rec.ID, old.Node)
	}
	if !granted && err == nil && old.Closing != nil {
		// Its events, stored after this life began, would end the
		// stream inside it (the client's open waits for them instead).
		return nil, false, schemas.Errf(schemas.CodeUnavailable, "agent %s: the coordinator has not finished closing its last life (its node was lost); open it again once it has", rec.ID)
	}
	// What the id's earlier lives used goes on with it, and where their
	// numbering ended: as the coordinator's claim carries them, or, over
	// a dead record the node claims itself, that record's lives.
	if err == nil {
		before := old.UsageBefore
		if !granted {
			before = old.NextLife()
		}
		events, turns := old.NextNumbers()
		a.mu.Lock()
		a.rec.UsageBefore = before
		a.rec.EventsBefore, a.rec.TurnsBefore = events, turns
		rec = a.rec
		a.mu.Unlock()
		val = encodeRecord(rec)
	}
	rev, err := r.kv.update(ctx, rec.ID, val, e.rev)
	if err != nil {
		if refused(err) {
			return nil, false, claimErr(rec, err)
		}
		return nil, true, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (its record changed while opening)", rec.ID)
	}
	r.setRev(rec.ID, rev)
	return func(ctx context.Context) {
		var past *schemas.AgentRecord
		if a.lastSeq() > 0 {
			past = &old
		}
		r.giveBack(ctx, a, rev, past)
	}, false, nil
}

// giveBack gives up the claim of agent a, at revision rev, whose open
// failed: an id with no event stored had no life before, and its record
// goes; one with a past is left dead, as its past life (past) left it.
func (r *records) giveBack(ctx context.Context, a *agent, rev uint64, past *schemas.AgentRecord) {
	var err error
	if past == nil {
		if err = r.kv.remove(ctx, a.id, rev); err == nil {
			r.mu.Lock()
			if r.life[a.id] == a {
				delete(r.life, a.id)
				delete(r.dirty, a.id)
				delete(r.rev, a.id)
				delete(r.lost, a.id)
			}
			r.mu.Unlock()
			return
		}
	} else {
		dead := *past
		dead.Status = schemas.StatusDead
		if _, err = r.kv.update(ctx, a.id, encodeRecord(dead), rev); err == nil {
			return
		}
	}
	// The fabric did not take it (a coordinator away as the open failed):
	// left so, the record said starting for good, naming a node that runs
	// no such agent, which no send, close or reopen could end. The node's
	// record writer writes it dead, trying again each second until it
	// lands, as any record of its agents.
	if refused(err) {
		// The relay keeps a live record from being removed by a node: it
		// is written dead instead.
		r.log.Info("the fabric keeps the record of an open that failed; it is written dead", "agent", a.id)
	} else {
		r.log.Warn("cannot give up an agent's claim now; its record is written dead once the fabric takes it", "agent", a.id, "err", err)
	}
	a.mu.Lock()
	a.rec.Status = schemas.StatusDead
	a.mu.Unlock()
	r.mu.Lock()
	r.ending[a.id] = a
	r.mu.Unlock()
	r.mark(a, true)
}

// claimErr is the error of a claim the fabric refused.
func claimErr(rec schemas.AgentRecord, err error) error {
	if refused(err) {
		return schemas.Errf(schemas.CodeConflict, "agent %s was not placed on node %s by the coordinator: %v", rec.ID, rec.Node, err)
	}
	return schemas.Errf(schemas.CodeUnavailable, "record the agent: %v", err)
}

func (r *records) setRev(id string, rev uint64) {
	r.mu.Lock()
	r.rev[id] = rev
	delete(r.lost, id)
	r.mu.Unlock()
}

// mark schedules a write of the agent's record.
func (r *records) mark(a *agent, urgent bool) {
	r.mu.Lock()
	r.dirty[a.id] = a
	r.urgent = r.urgent || urgent
	r.mu.Unlock()
	if urgent {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// forget deletes the record of an agent the node no longer keeps, unless
// the id has a newer life, or keep says the record is to stay (the node
// only stops writing it).
func (r *records) forget(ctx context.Context, a *agent, keep bool) {
	id := a.id
	r.mu.Lock()
	if r.life[id] != a {
		r.mu.Unlock()
		return
	}
	delete(r.life, id)
	delete(r.dirty, id)
	rev, lost := r.rev[id], r.lost[id]
	delete(r.rev, id)
	delete(r.lost, id)
	r.mu.Unlock()
	if lost || keep {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.kv.remove(ctx, id, rev); err != nil {
		r.log.Debug("cannot delete a retired agent's record", "agent", id, "err", err)
	}
}

func (r *records) run(ctx context.Context) {
	defer r.work.Wait()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-t.C:
		}
		r.writeAll(ctx)
	}
}

// writeNow writes the agent's record before it returns: what a caller is
// told (a turn's number) is in the record first, so a node lost right
// after cannot take it with it.
func (r *records) writeNow(ctx context.Context, a *agent) error {
	r.mu.Lock()
	delete(r.dirty, a.id)
	r.mu.Unlock()
	return r.write(ctx, a)
}

// flush writes every pending record.
func (r *records) flush(ctx context.Context) { r.writeAll(ctx) }

func (r *records) writeAll(ctx context.Context) {
	r.mu.Lock()
	batch := r.dirty
	r.dirty = map[string]*agent{}
	r.urgent = false
	r.mu.Unlock()
	failed, example, first := 0, "", error(nil)
	for id, a := range batch {
		if err := r.write(ctx, a); err != nil {
			if failed++; first == nil {
				example, first = id, err
			}
			r.mark(a, false)
			continue
		}
		r.mu.Lock()
		ended := r.ending[id] == a
		if ended {
			delete(r.ending, id)
		}
		r.mu.Unlock()
		if ended {
			// A failed open's claim, written dead: nothing of the node's
			// writes it again.
			r.forget(ctx, a, true)
		}
	}
	// Said once a pass, and while they keep failing (the fabric away:
	// every agent's record fails each second), once every failWarnEvery.
	now := time.Now()
	r.mu.Lock()
	say := failed > 0 && (!r.failing || now.Sub(r.warned) >= failWarnEvery)
	if r.failing = failed > 0; say {
		r.warned = now
	}
	r.mu.Unlock()
	if say {
		r.log.Warn("cannot write agents' records; will retry", "agents", failed, "agent", example, "err", first)
	}
}

// failWarnEvery is how often records that keep failing are logged.
const failWarnEvery = 30 * time.Second

// write stores one record with compare-and-set, re-reading the revision
// when it moved; a record another node now owns is left alone.
func (r *records) write(ctx context.Context, a *agent) error {
	// One write of an agent's record at a time: the node's own writes
	// never race each other for the revision.
	a.recMu.Lock()
	defer a.recMu.Unlock()
	for range 3 {
		// Taken anew on each try: a try that lost to a newer write must not
		// put back an older state.
		rec := a.record()
		val := encodeRecord(rec)
		r.mu.Lock()
		rev, lost, current := r.rev[a.id], r.lost[a.id], r.life[a.id] == a
		r.mu.Unlock()
		if lost || !current {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		newRev, err := r.kv.update(wctx, a.id, val, rev)
		cancel()
		if err == nil {
			r.setRev(a.id, newRev)
			return nil
		}
		// The revision moved, or the relay refused the write for good
		// (for a confined node, the word that the agent is dead or
		// another's: the relay judges that before the revision): the
		// record is read again, and says which.
		var apiErr *jetstream.APIError
		wrongRev := errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
		if !wrongRev && !refused(err) {
			return err
		}
		e, gerr := r.kv.get(ctx, a.id)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			if !wrongRev {
				// Removed, or (the relay answers a node only of its own
				// agents) another node's now.
				r.takenForLost(ctx, a.id, "")
				return nil
			}
			if newRev, err := r.kv.create(ctx, a.id, val); err == nil {
				r.setRev(a.id, newRev)
				return nil
			}
			continue
		}
		if gerr != nil {
			return gerr
		}
		cur, derr := decodeRecord(e.value)
		if derr == nil && (takenFrom(cur, rec, r.node) || closedByAnother(cur, rec, e.value, val)) {
			r.takenForLost(ctx, a.id, cur.Node)
			return nil
		}
		if !wrongRev {
			return err // refused for another reason, the relay's words say which
		}
		r.setRev(a.id, e.rev)
	}
	return errors.New("the record kept changing")
}

// takenFrom reports whether cur, an agent's record as the fabric has it,
// says the agent is no longer this node's: another node owns it, or it was
// marked dead while mine, the node's own, is not.
func takenFrom(cur, mine schemas.AgentRecord, node string) bool {
	return cur.Node != node || (cur.Status == schemas.StatusDead && mine.Status != schemas.StatusDead)
}

// closedByAnother reports whether cur, a dead record the node did not
// write (its value is not what the node writes, b, and its revision moved
// past the node's), closed an agent mine also says is dead: the
// coordinator closed it while the node was cut off, and the node's own
// closing, written to its outbox meanwhile, must not follow.
func closedByAnother(cur, mine schemas.AgentRecord, value, b []byte) bool {
	return cur.Status == schemas.StatusDead && mine.Status == schemas.StatusDead && !bytes.Equal(value, b)
}

// reassert writes the record of each of the node's agents again, dead
// ones included, after the node's heartbeat was written: a coordinator
// that took the node for lost and has read a record but not yet written
// it dead then finds it changed and leaves it; one that wrote first is
// found here. It reports the agents the fabric took for lost.
func (r *records) reassert(ctx context.Context) (lost []*agent, err error) {
	r.mu.Lock()
	lives := make([]*agent, 0, len(r.life))
	for _, a := range r.life {
		lives = append(lives, a)
	}
	r.mu.Unlock()
	for _, a := range lives {
		if err := r.write(ctx, a); err != nil {
			return nil, err
		}
		r.mu.Lock()
		gone := r.lost[a.id] && r.life[a.id] == a
		r.mu.Unlock()
		if gone {
			lost = append(lost, a)
		}
	}
	return lost, nil
}

// takenForLost stops the node's work on an agent the fabric took for lost
// while this node still ran it (the node was cut off, or stopped, past its
// heartbeat's TTL): its record is no longer written, and the host
// abandons it.
func (r *records) takenForLost(ctx context.Context, id, owner string) {
	r.mu.Lock()
	if r.lost[id] {
		r.mu.Unlock()
		return
	}
	r.lost[id] = true
	r.mu.Unlock()
	r.log.Error("the fabric took this agent for lost; the node stops it and no longer writes its record", "agent", id, "owner", owner)
	if r.abandon != nil {
		r.work.Go(func() { r.abandon(context.WithoutCancel(ctx), id) })
	}
}

func encodeRecord(rec schemas.AgentRecord) []byte {
	b, _ := json.Marshal(rec)
	return b
}

func decodeRecord(b []byte) (schemas.AgentRecord, error) {
	var rec schemas.AgentRecord
	err := json.Unmarshal(b, &rec)
	return rec, err
}
