package node

import (
	"context"
	"fmt"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// enqueue numbers an event for the outbox: its number reserved in the
// numbers file first, then the event to the journal and on to the stream.
func (h *Host) enqueue(agent string, seq uint64, wire []byte, at time.Time) {
	if err := h.nums.reserve(agent, seq); err != nil {
		h.log.Error("cannot reserve event numbers on disk; a lost journal could not be told", "agent", agent, "err", err)
	}
	h.pub.enqueue(newOutMsg(h.store.eventSubject(agent), h.cfg.Name, agent, seq, wire, at))
}

// tails reports how each agent's events end: the stream's tail, or, for an
// agent some of whose events wait in the outbox, the last of those.
func (h *Host) tails(ctx context.Context, ids []string) (map[string]schemas.Tail, error) {
	tails, err := h.store.tails(ctx, ids)
	if tails == nil {
		tails = map[string]schemas.Tail{}
	}
	for _, id := range ids {
		if t, ok := h.pub.pendingTail(id); ok && t.Last > tails[id].Last {
			tails[id] = t
		}
	}
	return tails, err
}

// resume takes up what a previous run of the node left: the events in its
// journal that the stream does not have yet go out again first, under
// their own numbers; and if the journal itself was lost while numbers were
// reserved, each agent concerned gets an error naming the numbers that
// may have been lost with it, and goes on after them.
func (h *Host) resume(ctx context.Context, j *journal, prev previous, nums numbersFile) error {
	lost := nums.Journal != "" && !prev.ids[nums.Journal] && len(nums.Marks) > 0
	agents := map[string]bool{}
	for _, m := range prev.events {
		agents[m.agent] = true
	}
	if lost {
		for a := range nums.Marks {
			agents[a] = true
		}
	}
	if len(agents) == 0 {
		return nil
	}
	ids := make([]string, 0, len(agents))
	for a := range agents {
		ids = append(ids, a)
	}
	stored, err := h.store.tails(ctx, ids)
	if err != nil {
		return fmt.Errorf("read the stream to resume the journal: %w", err)
	}
	again := 0
	for _, m := range prev.events {
		if m.seq > stored[m.agent].Last {
			m.jseq = 0
			h.pub.enqueue(m)
			again++
		}
	}
	if again > 0 {
		h.log.Info("publishing again what the journal kept from before the node stopped", "events", again)
	}
	if lost {
		now := time.Now()
		for a, mark := range nums.Marks {
			last := stored[a].Last
			if t, ok := h.pub.pendingTail(a); ok {
				last = t.Last
			}
			if mark <= last {
				continue
			}
			h.log.Error("the node's journal is gone; the numbers it may have used are not used again", "agent", a, "from", last+1, "to", mark)
			wire, err := schemas.Encode(schemas.LostRangeError(a, stored[a].Turn, last+1, mark))
			if err != nil {
				return err
			}
			h.enqueue(a, mark+1, wire, now)
		}
	}
	// The old segments go once the fresh journal has what they held.
	if err := j.syncNow(); err != nil {
		return fmt.Errorf("write the journal: %w", err)
	}
	j.removeOld(prev.segments)
	return nil
}
