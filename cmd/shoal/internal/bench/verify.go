package bench

import (
	"context"
	"fmt"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// verify reads every agent's stream after the turns: each agent's events
// must be numbered 1, 2, … with no gap and no stray, its deltas the
// stand-in's 1 … Events of each turn in order, and each turn must end with
// a result whose output count is the deltas stored. It fills rep's
// Events and Verified, and adds each delta's delay from its print to its
// storing to stored.
// The stored latency of the turns after the first watched goes to bare,
// of those to stored.
func verify(ctx context.Context, f client.Client, agents []*agent, turns, watched int, rep *Report, bare, stored *samples) error {
	v := &rep.Verified
	v.TurnsExpected = len(agents) * turns
	problem := func(format string, args ...any) {
		if len(v.Problems) < 20 {
			v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
		}
	}
	type state struct {
		last    uint64 // the last event number
		delta   int64  // the stand-in's number of the last delta this turn
		bad     bool
		results int
	}
	states := make(map[string]*state, len(agents))
	ids := make([]string, len(agents))
	for i, a := range agents {
		ids[i] = a.id
		states[a.id] = &state{}
	}
	err := f.Replay(ctx, ids, client.From{}, false, func(r client.Replayed, g *client.Gap) error {
		if g != nil {
			s := states[g.Agent]
			if s != nil {
				s.bad = true
			}
			problem("%v", g)
			return nil
		}
		s := states[r.Agent]
		if s == nil {
			return nil
		}
		if r.Stray != "" {
			s.bad = true
			problem("agent %s: a stray message at stream sequence %d: %s", r.Agent, r.Seq, r.Stray)
			return nil
		}
		if r.N != s.last+1 {
			s.bad = true
			problem("agent %s: event %d follows event %d", r.Agent, r.N, s.last)
		}
		s.last = r.N
		v.Stored++
		if r.Turn >= 1 {
			rep.Events++
		}
		if r.Delta {
			k, printed, ok := stamp(r.Raw)
			if !ok {
				return nil
			}
			if k != s.delta+1 {
				s.bad = true
				problem("agent %s turn %d: the stand-in's delta %d follows delta %d", r.Agent, r.Turn, k, s.delta)
			}
			s.delta = k
			v.Deltas++
			if r.Turn > watched {
				bare.add(r.Time.UnixNano() - printed)
			} else {
				stored.add(r.Time.UnixNano() - printed)
			}
			return nil
		}
		if r.Kind != schemas.KindResult {
			return nil
		}
		ev, err := r.Event()
		if err != nil {
			s.bad = true
			problem("agent %s: result %d does not decode: %v", r.Agent, r.N, err)
			return nil
		}
		res, _ := ev.Payload.(schemas.Result)
		switch {
		case res.Usage == nil:
			problem("agent %s turn %d: the result has no usage", r.Agent, r.Turn)
		case res.Usage.OutputTokens != s.delta:
			problem("agent %s turn %d: the stand-in printed %d deltas, the stream has %d", r.Agent, r.Turn, res.Usage.OutputTokens, s.delta)
		default:
			v.TurnsEnded++
		}
		s.results++
		s.delta = 0
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the agents' streams: %w", err)
	}
	for _, a := range agents {
		s := states[a.id]
		if s.results != turns {
			problem("agent %s: %d of %d turns ended", a.id, s.results, turns)
		}
		if !s.bad && s.last > 0 {
			v.Gapless++
		}
	}
	return nil
}
