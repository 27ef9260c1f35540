package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// tails reports how each agent's events end: the stream's tail, or, for an
// agent some of whose events wait in the outbox, the last of those.
func (h *Host) tails(ctx context.Context, ids []string) (map[string]schemas.Tail, error) {
	// What waits is taken before the stream is read: an event stored
	// between the two reads is then in one or the other. (Read after, an
	// event stored after the stream's read and acknowledged before the
	// outbox's was in neither: a restart's closing events took numbers
	// under the lost range's error it had just published.)
	pending := map[string]schemas.Tail{}
	for _, id := range ids {
		if t, ok := h.pub.pendingTail(id); ok {
			pending[id] = t
		}
	}
	tails, err := h.store.tails(ctx, ids)
	if tails == nil {
		tails = map[string]schemas.Tail{}
	}
	for id, t := range pending {
		if t.Last > tails[id].Last {
			tails[id] = t
		}
	}
	return tails, err
}

// resume takes up what a previous run of the node left: the events in its
// journal that the stream does not have yet go out again first, under
// their own numbers; and if the journal itself was lost while numbers were
// reserved, or cut short by a damaged record, each agent concerned gets an
// error naming the numbers that may have been lost with it, and goes on
// after them. Every agent's mark is then its exact last number, so a
// journal lost later is told exactly what it took.
func (h *Host) resume(ctx context.Context, j *journal, prev previous, nums numbersFile) error {
	gone := nums.Journal != "" && !prev.ids[nums.Journal]
	lost := (gone || prev.damaged || prev.failed) && len(nums.Marks) > 0
	agents := map[string]bool{}
	for _, m := range prev.events {
		agents[m.agent] = true
	}
	for a := range nums.Marks {
		agents[a] = true
	}
	if len(agents) == 0 {
		return h.nums.clear()
	}
	ids := make([]string, 0, len(agents))
	for a := range agents {
		ids = append(ids, a)
	}
	stored, err := h.store.tails(ctx, ids)
	if err != nil {
		return fmt.Errorf("read the stream to resume the journal: %w", err)
	}
	closed, err := h.closedWithout(ctx, ids, stored)
	if err != nil {
		return fmt.Errorf("read the records to resume the journal: %w", err)
	}
	again, dropped := 0, map[string]int{}
	for _, m := range prev.events {
		switch {
		case m.seq <= stored[m.agent].Last:
		case closed[m.agent]:
			dropped[m.agent]++
		default:
			m.jseq = 0
			h.pub.enqueue(m)
			again++
			h.noteJournaledResult(m)
		}
	}
	for id, n := range dropped {
		h.log.Warn("the fabric took this agent for lost and closed it while the node was away (or opened it again elsewhere); what the journal kept of it is dropped", "agent", id, "events", n)
	}
	if again > 0 {
		h.log.Info("publishing again what the journal kept from before the node stopped", "events", again)
	}
	now := time.Now()
	for a := range agents {
		last := stored[a].Last
		if t, ok := h.pub.pendingTail(a); ok {
			last = max(last, t.Last)
		}
		if mark := nums.Marks[a]; lost && mark > last && !closed[a] {
			why := "the node's journal is gone"
			switch {
			case gone:
			case prev.damaged:
				why = "the node's journal was cut short by a damaged record"
			default:
				why = "the node's journal could not write every record (a full disk)"
			}
			h.log.Error(why+"; the numbers it may have used are not used again", "agent", a, "from", last+1, "to", mark)
			wire, err := schemas.Encode(schemas.LostRangeError(a, stored[a].Turn, last+1, mark))
			if err != nil {
				return err
			}
			last = mark + 1
			h.enqueue(a, last, wire, now)
		}
		if err := h.nums.settle(a, last); err != nil {
			return err
		}
	}
	// The old segments go once the fresh journal has what they held.
	if err := j.syncNow(); err != nil {
		return fmt.Errorf("write the journal: %w", err)
	}
	j.removeOld(prev.segments)
	return nil
}

// closedWithout reports the agents whose journal's events are no longer
// this node's to send: their life was closed without this node while it
// was away. So is one whose record now names another node (the id was
// reopened there, numbering after the close), or says the coordinator
// closed it (closed_by: its closing events may not be stored yet); and
// one whose stream ends with a death that is not the end of a life the
// node began since (a life numbered after the death is a later one, whose
// events go as usual). Nothing of a life may be stored after its death,
// nor under another life's numbers.
func (h *Host) closedWithout(ctx context.Context, ids []string, tails map[string]schemas.Tail) (map[string]bool, error) {
	closed := map[string]bool{}
	for _, id := range ids {
		t := tails[id]
		e, err := h.store.get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			closed[id] = t.Dead
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read agent %s's record: %w", id, err)
		}
		rec, err := decodeRecord(e.value)
		switch {
		case err != nil:
			closed[id] = t.Dead
		case rec.Node != h.cfg.Name, rec.Status == schemas.StatusDead && rec.ClosedBy != "":
			closed[id] = true
		default:
			closed[id] = t.Dead && rec.EventsBefore < t.Last
		}
	}
	return closed, nil
}

// journaledResult is a turn's result the journal kept and the restart
// stores: what the turn used, which the agent's record, written before
// the turn ended, may not count.
type journaledResult struct {
	seq   uint64
	usage schemas.Usage
}

// noteJournaledResult keeps m's usage when m, an event the journal kept,
// is a turn's result: the record the restart closes the agent with counts
// it (countJournaled).
func (h *Host) noteJournaledResult(m *outMsg) {
	if !bytes.Contains(m.data, []byte(`"kind":"result"`)) {
		return
	}
	ev, err := schemas.Decode(m.data)
	r, ok := ev.Payload.(schemas.Result)
	if err != nil || !ok || r.Usage == nil {
		return
	}
	if h.journaled == nil {
		h.journaled = map[string][]journaledResult{}
	}
	h.journaled[m.agent] = append(h.journaled[m.agent], journaledResult{m.seq, *r.Usage})
}

// countJournaled adds to rec, the record of an agent a previous run left
// open, the usage of the turns the journal kept the results of and the
// record does not count: those numbered after its last event. The turn
// the record says is running (its usage so far) is the first of them,
// whose result counts it whole.
func (h *Host) countJournaled(rec *schemas.AgentRecord) {
	for _, r := range h.journaled[rec.ID] {
		if r.seq <= rec.LastEvent {
			continue
		}
		rec.Running = nil
		rec.Usage.Add(r.usage)
	}
}
