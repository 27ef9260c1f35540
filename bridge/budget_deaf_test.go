package bridge_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// deafBackend's agents spend as told, 500 tokens each 100 ms, reporting
// their use as they go (as the claude CLI does), and take an interrupt
// without heeding it (failure-modes.md: "a repeated interrupt stays
// pending forever", "session stuck after a cancel"): the turn ends only
// with its work done, or the CLI stopped.
type deafBackend struct{ spent atomic.Int64 }

func (b *deafBackend) Kind() string { return backend.BackendClaude }

func (b *deafBackend) Start(_ context.Context, _ backend.Spec, sink backend.Sink) (backend.Session, error) {
	return &deafSession{b: b, sink: sink, stop: make(chan struct{})}, nil
}

type deafSession struct {
	b      *deafBackend
	sink   backend.Sink
	stop   chan struct{}
	closed atomic.Bool
}

func (s *deafSession) Prompt(_ context.Context, _ int, text string) error {
	n, _ := strconv.Atoi(strings.TrimPrefix(text, "spend "))
	go func() {
		used := 0
		for used < n {
			select {
			case <-s.stop:
				return // the CLI was stopped: the node closes the turn
			case <-time.After(100 * time.Millisecond):
			}
			used += 500
			s.b.spent.Add(500)
			backend.Spending(s.sink, schemas.Usage{OutputTokens: int64(used)})
		}
		s.sink.Emit(schemas.Event{Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{OutputTokens: int64(used)}}})
	}()
	return nil
}

// Interrupt is taken, and not heeded.
func (s *deafSession) Interrupt(context.Context) (bool, error) { return true, nil }

func (s *deafSession) Close(context.Context) error {
	if s.closed.CompareAndSwap(false, true) {
		close(s.stop)
		s.sink.Emit(schemas.Event{Payload: schemas.Status{Status: schemas.StatusDead}})
	}
	return nil
}

func (s *deafSession) Info() backend.Info { return backend.Info{} }

// An agent under a budget of 1,000 tokens runs a turn whose CLI reports
// its use as it goes but does not heed an interrupt. The node saw the turn
// cross the budget, sent one interrupt, and never followed it up: the
// turn went on to spend 40,000 tokens. As after its watchdogs' interrupt,
// the node stops a CLI whose turn has not ended InterruptGrace (here 1 s)
// after the budget's.
func TestBudgetStopsATurnWhoseCLIDoesNotHeedTheInterrupt(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	be := &deafBackend{}
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{be}, InterruptGrace: time.Second})
	person := fb.client(nil)
	var rep schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": t.TempDir(), "id": "deaf", "budget_tokens": 1000, "disallowed_tools": []string{}}, &rep)
	if text, isErr := call(t, person, "agent_send", map[string]any{"agent_id": "deaf", "text": "spend 40000"}); isErr {
		t.Fatal(text)
	}
	poll.Until(t, 60*time.Second, "the turn to end", func() bool {
		rec, err := fb.f.Record(t.Context(), "deaf")
		return err == nil && rec.Status != schemas.StatusWorking && be.spent.Load() > 0
	})
	if spent := be.spent.Load(); spent > 10000 {
		t.Errorf("an agent under a budget of 1,000 tokens spent %d in one turn: its CLI did not heed the budget's interrupt, and nothing followed it up", spent)
	}
}
