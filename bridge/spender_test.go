package bridge_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// spender is a stand-in claude backend for the budget tests, whose agents
// spend as told: a turn "spend N" spends N tokens, step at a time, one step
// each every (all at once when step is 0), and ends with a result carrying
// what it spent. The other fields say how its CLI behaves.
type spender struct {
	step  int64
	every time.Duration
	// atEnd: the use is reported with the result only, as ACP agents
	// report it; otherwise at every step as well, as the claude CLI does.
	atEnd bool
	// gate, when set, holds turns until it is closed: only the first turn
	// to reach any CLI when firstOnly, every turn otherwise.
	gate      chan struct{}
	firstOnly bool
	interrupt interruptWay
	// diesFirst: the first CLI started dies (its agent's status dead)
	// before its first turn's result, as a CLI that crashes or is
	// OOM-killed.
	diesFirst bool

	prompts atomic.Int32 // turns that reached a CLI
	started atomic.Int32 // CLIs started
	spent   atomic.Int64 // every token the CLIs reported spending
}

// interruptWay is how a spender's CLI takes an interrupt.
type interruptWay int

const (
	heeds   interruptWay = iota // the running turn ends, cancelled
	deaf                        // taken, and not heeded (failure-modes.md: "a repeated interrupt stays pending forever")
	refuses                     // refused
)

func (b *spender) Kind() string { return backend.BackendClaude }

func (b *spender) Start(_ context.Context, _ backend.Spec, sink backend.Sink) (backend.Session, error) {
	dies := b.started.Add(1) == 1 && b.diesFirst
	return &spenderSession{b: b, sink: sink, dies: dies, closed: make(chan struct{})}, nil
}

type spenderSession struct {
	b      *spender
	sink   backend.Sink
	dies   bool
	closed chan struct{} // the CLI was stopped
	once   sync.Once

	mu   sync.Mutex
	stop chan struct{} // the running turn's, closed by a heeded interrupt
}

func (s *spenderSession) Prompt(_ context.Context, _ int, text string) error {
	n, _ := strconv.ParseInt(strings.TrimPrefix(text, "spend "), 10, 64)
	first := s.b.prompts.Add(1) == 1
	stop := make(chan struct{})
	s.mu.Lock()
	s.stop = stop
	s.mu.Unlock()
	go func() {
		if s.b.gate != nil && (first || !s.b.firstOnly) {
			select {
			case <-s.b.gate:
			case <-s.closed:
				return
			}
		}
		used, reason := int64(0), schemas.StopEndTurn
		if s.b.step == 0 {
			used = n
		}
		for used < n && reason == schemas.StopEndTurn {
			select {
			case <-s.closed:
				return // the CLI was stopped: the node closes the turn
			case <-stop:
				reason = schemas.StopCancelled
				continue
			case <-time.After(s.b.every):
			}
			used += s.b.step
			s.b.spent.Add(s.b.step)
			if !s.b.atEnd {
				backend.Spending(s.sink, schemas.Usage{OutputTokens: used})
			}
		}
		s.mu.Lock()
		if s.stop == stop {
			s.stop = nil
		}
		s.mu.Unlock()
		if s.dies {
			s.sink.Emit(schemas.Event{Payload: schemas.Status{Status: schemas.StatusDead}})
			return
		}
		s.sink.Emit(schemas.Event{Payload: schemas.Result{StopReason: reason, Usage: &schemas.Usage{OutputTokens: used}}})
	}()
	return nil
}

func (s *spenderSession) Interrupt(context.Context) (bool, error) {
	switch s.b.interrupt {
	case deaf:
		return true, nil
	case refuses:
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop == nil {
		return false, nil
	}
	close(s.stop)
	s.stop = nil
	return true, nil
}

func (s *spenderSession) Close(context.Context) error {
	s.once.Do(func() {
		close(s.closed)
		s.sink.Emit(schemas.Event{Payload: schemas.Status{Status: schemas.StatusDead}})
	})
	return nil
}

func (s *spenderSession) Info() backend.Info { return backend.Info{} }
