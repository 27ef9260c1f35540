package client

import (
	"context"
	"errors"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// MaxEventsPage bounds one page of events.
const MaxEventsPage = 5000

// Events reads a page of an agent's events from the stream: from the
// start, an event number, a turn or a time, with gaps reported and the
// number to continue from.
func (f *Direct) Events(ctx context.Context, req schemas.EventsRequest) (schemas.EventsReply, error) {
	rep := schemas.EventsReply{AgentID: req.AgentID, Events: []schemas.StoredEvent{}, Gaps: []schemas.EventGap{}}
	if err := schemas.ValidID(req.AgentID); err != nil {
		return rep, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	set := 0
	var from From
	if req.FromEvent > 0 {
		from.Event, set = req.FromEvent, set+1
	}
	if req.FromTurn < 0 {
		return rep, schemas.Errf(schemas.CodeInvalid, "from_turn must be positive")
	}
	if req.FromTurn > 0 {
		from.Turn, set = req.FromTurn, set+1
	}
	if req.Since != "" {
		t, err := time.Parse(time.RFC3339Nano, req.Since)
		if err != nil {
			return rep, schemas.Errf(schemas.CodeInvalid, "since %q is not an RFC 3339 time (e.g. 2026-11-29T10:00:00Z)", req.Since)
		}
		from.Time, set = t, set+1
	}
	if set > 1 {
		return rep, schemas.Errf(schemas.CodeInvalid, "give at most one of from_event, from_turn and since")
	}
	limit := req.Max
	switch {
	case limit < 0 || limit > MaxEventsPage:
		return rep, schemas.Errf(schemas.CodeInvalid, "max must be between 1 and %d", MaxEventsPage)
	case limit == 0:
		limit = 200
	}
	if _, _, err := f.record(ctx, req.AgentID); err != nil && schemas.CodeOf(err) != schemas.CodeNotFound {
		return rep, err
	}
	// A page is cut at its count or at half a message of this fabric,
	// whichever comes first, so it can be answered through the fabric
	// service; it holds one event at least.
	room, size := int(f.nc.MaxPayload())/2, 256
	err := f.Replay(ctx, []string{req.AgentID}, from, false, func(r Replayed, gap *Gap) error {
		if r.Stray != "" {
			// Named while they take at most a quarter of a message,
			// counted beyond: a subject full of them leaves the page
			// its room for events.
			if size+len(r.Stray)+64 > room/2 {
				rep.ForeignOmitted++
				return nil
			}
			rep.Foreign = append(rep.Foreign, schemas.ForeignMessage{Seq: r.Seq, N: r.N, Reason: r.Stray})
			size += len(r.Stray) + 64
			return nil
		}
		if len(rep.Events) >= limit || (len(rep.Events) > 0 && size+len(r.Raw)+len(r.Node)+128 > room) {
			rep.More = true
			return errStop
		}
		if !r.Delta || req.IncludeDeltas {
			size += len(r.Raw) + len(r.Node) + 128
		}
		if gap != nil {
			rep.Gaps = append(rep.Gaps, schemas.EventGap{From: gap.From, To: gap.To})
		}
		rep.NextEvent = r.N + 1
		if r.Delta && !req.IncludeDeltas {
			return nil
		}
		rep.Events = append(rep.Events, schemas.StoredEvent{N: r.N, Time: r.Time.UTC().Format(time.RFC3339Nano), Node: r.Node, Event: r.Raw})
		return nil
	})
	if g, ok := errors.AsType[Gap](err); ok {
		// Retention dropped every event of the agent from the start
		// point on: said as a gap, and the read goes on after its last.
		rep.Gaps = append(rep.Gaps, schemas.EventGap{From: g.From, To: g.To})
		rep.NextEvent = g.To + 1
		return rep, nil
	}
	if err != nil || rep.NextEvent > 0 {
		return rep, err
	}
	// Caught up: a poller goes on from where it asked, or after the last
	// event stored; next_event never moves backwards.
	last, err := f.lastEvent(ctx, req.AgentID)
	rep.NextEvent = max(req.FromEvent, last+1)
	return rep, err
}

// lastEvent is the number of an agent's last stored event, 0 when none.
func (f *Direct) lastEvent(ctx context.Context, id string) (uint64, error) {
	stream, err := f.events(ctx)
	if err != nil {
		return 0, err
	}
	tail, _, err := StreamTail(ctx, f.nc, stream, id)
	return tail.Last, err
}
