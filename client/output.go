package client

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// Output answers agent_output from the agent's events in the stream and
// its record, so it answers the same whether its node runs, is gone, or
// no longer keeps the agent: one path for every surface.
func (f *Direct) Output(ctx context.Context, req schemas.OutputRequest) (schemas.OutputReply, error) {
	if err := schemas.ValidID(req.AgentID); err != nil {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	var rec *schemas.AgentRecord
	switch r, _, err := f.record(ctx, req.AgentID); {
	case err == nil:
		rec = &r
	case schemas.CodeOf(err) != schemas.CodeNotFound:
		return schemas.OutputReply{}, err
	}
	stored, err := f.stored(ctx, req.AgentID)
	if err != nil {
		return schemas.OutputReply{}, err
	}
	if rec == nil && stored.First == 0 {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", req.AgentID)
	}
	if stored.First == 0 && rec != nil && rec.LastEvent > 0 {
		stored.Dropped = f.droppedAfter(ctx, rec.LastActivity)
	}
	return schemas.OutputOf(stored, rec, req)
}

// droppedAfter says whether the stream dropped every event an agent made
// up to last (its record's last activity, unix seconds by its node's
// clock): the agent has been quiet longer than the stream keeps events,
// or the oldest message the stream holds is newer than its last activity
// by more than the clocks of two machines may differ. Otherwise its
// events are taken to be on their way: a record numbers an event before
// the stream holds it.
func (f *Direct) droppedAfter(ctx context.Context, last float64) bool {
	st, err := f.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return false
	}
	info := st.CachedInfo()
	if info == nil {
		return false
	}
	at := time.Unix(int64(last), 0)
	if info.Config.MaxAge > 0 && time.Since(at) > info.Config.MaxAge {
		return true
	}
	return info.State.Msgs > 0 && info.State.FirstTime.After(at.Add(clockSlack))
}

// clockSlack is how far a node's clock may be from the server's.
const clockSlack = 30 * time.Second

// stored reads an agent's events from the stream, every life of its id,
// up to the last one stored now.
func (f *Direct) stored(ctx context.Context, id string) (*schemas.Stored, error) {
	s, _, err := f.storedWithEnds(ctx, id)
	return s, err
}

// storedWithEnds is stored with the first and last events read.
func (f *Direct) storedWithEnds(ctx context.Context, id string) (*schemas.Stored, [2]Replayed, error) {
	var s *schemas.Stored
	var ends [2]Replayed
	err := f.Replay(ctx, []string{id}, From{}, false, func(r Replayed, _ *Gap) error {
		if r.Stray != "" {
			return nil // not the agent's: its output is its own events'
		}
		if s == nil {
			s, ends[0] = schemas.NewStored(r.N), r
		}
		ends[1] = r
		if ev, err := r.Event(); err == nil {
			s.Add(ev)
		}
		return nil
	})
	if _, aged := errors.AsType[Gap](err); err != nil && !aged {
		return nil, ends, err
	}
	if s == nil {
		s = schemas.NewStored(0) // nothing stored: none made, or all dropped
	}
	return s, ends, nil
}

// recordFromStream is the record of an agent the fabric no longer keeps
// (a dead agent pruned from those kept) whose events the stream still
// holds: dead, at its last turn, with its last life's usage, its last
// node, and the times of its first and last stored events. What the
// stream does not say (model, cwd, session) is empty.
func (f *Direct) recordFromStream(ctx context.Context, id string) (schemas.AgentRecord, error) {
	s, ends, err := f.storedWithEnds(ctx, id)
	if err != nil {
		return schemas.AgentRecord{}, err
	}
	if s.First == 0 {
		return schemas.AgentRecord{}, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
	}
	if rec, ok := f.prunedRecord(ctx, id); ok {
		return rec, nil
	}
	return schemas.AgentRecord{
		ID: id, Status: schemas.StatusDead, Turn: s.Last, Usage: s.Usage, Node: ends[1].Node,
		CreatedAt: unixSeconds(ends[0].Time), LastActivity: unixSeconds(ends[1].Time),
		QueuesPrompts: true,
	}, nil
}

// prunedRecord is the last record a node wrote of a dead agent it has
// since forgotten (pruned beyond the dead it keeps): the marker that
// forgot it carries it (ForgetRecord), or, forgotten by a plain delete,
// the bucket keeps a few revisions of the key, so its model, cwd,
// session and event log are still said.
func (f *Direct) prunedRecord(ctx context.Context, id string) (schemas.AgentRecord, bool) {
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return schemas.AgentRecord{}, false
	}
	hist, err := kv.History(ctx, id)
	if err != nil {
		return schemas.AgentRecord{}, false
	}
	for i := len(hist) - 1; i >= 0; i-- {
		switch hist[i].Operation() {
		case jetstream.KeyValuePut:
		case jetstream.KeyValueDelete:
			if len(hist[i].Value()) == 0 {
				continue // a plain delete: the revision before it says
			}
		default:
			continue
		}
		var rec schemas.AgentRecord
		if json.Unmarshal(hist[i].Value(), &rec) != nil || rec.Status != schemas.StatusDead {
			return schemas.AgentRecord{}, false
		}
		return rec, true
	}
	return schemas.AgentRecord{}, false
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
