package tui

import (
	"errors"
	"maps"
	"sync"
	"time"
)

// Backoff of the follower between two attempts after a lost connection.
const (
	firstRetry = 500 * time.Millisecond
	maxRetry   = 10 * time.Second
	// settled is how long an attempt must run before the follower takes
	// the feed for back when no event says so sooner.
	settled = 5 * time.Second
)

// feedState is what the follower tells the screen about the live feed.
type feedState struct {
	lost    error         // the connection was lost with this error
	retryIn time.Duration // and the next attempt starts after this
	back    bool          // the feed runs again after a loss
}

// follow runs the live feed until the monitor's context ends: it calls
// Source.Follow, and when that ends on a lost connection it tries again
// with a growing pause, resuming after the last event it saw of each
// agent.
func (m *Model) follow() {
	from := Resume{Last: map[string]uint64{}}
	wait := firstRetry
	lost := false
	for {
		start := time.Now()
		if from.Since.IsZero() && lost {
			// Nothing was seen before the loss: everything since the
			// feed first started.
			from.Since = m.started
		}
		attempt := Resume{Since: from.Since, Last: maps.Clone(from.Last)}
		var again *reattempt
		if lost {
			again = &reattempt{m: m}
			again.timer = time.AfterFunc(settled, again.back)
		}
		err := m.src.Follow(m.ctx, attempt, func(ev Event) {
			if ev.N > 0 {
				if ev.N <= from.Last[ev.Agent] {
					return // seen before the loss
				}
				from.Last[ev.Agent] = ev.N
			}
			if !ev.Stored.IsZero() && ev.Stored.After(from.Since) {
				from.Since = ev.Stored
			}
			if again != nil {
				again.back()
			}
			select {
			case m.events <- incoming{ev: ev, at: time.Now()}:
			case <-m.ctx.Done():
			}
		})
		if again != nil {
			again.end()
		}
		if m.ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errFeedEnded
		}
		if time.Since(start) > settled {
			wait = firstRetry // it ran a while: a fresh loss
		}
		lost = true
		m.note(feedState{lost: err, retryIn: wait})
		select {
		case <-time.After(wait):
		case <-m.ctx.Done():
			return
		}
		wait = min(2*wait, maxRetry)
	}
}

// errFeedEnded is the loss of a follow that ended without saying why.
var errFeedEnded = errors.New("the live feed ended")

// reattempt is an attempt after a loss: it says once that the feed runs
// again, on its first event or once it has run a while, and never after
// it has ended.
type reattempt struct {
	m          *Model
	timer      *time.Timer
	mu         sync.Mutex
	said, done bool
}

func (a *reattempt) back() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.said || a.done {
		return
	}
	a.said = true
	a.m.note(feedState{back: true})
}

func (a *reattempt) end() {
	a.timer.Stop()
	a.mu.Lock()
	a.done = true
	a.mu.Unlock()
}

func (m *Model) note(s feedState) {
	select {
	case m.feedStates <- s:
	case <-m.ctx.Done():
	}
}
