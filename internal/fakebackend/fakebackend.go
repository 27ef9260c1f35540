// Package fakebackend is an agent backend with no process, for tests: the
// first-class fake every test of the node, the coordinator and the
// clients can run agents on without a CLI. What a turn does is read from
// its text:
//
//	stall …   streams a first chunk, then nothing until it is interrupted
//	slow …    answers like anything else, a word every 40ms
//	die …     streams a first chunk, then the agent dies (as a CLI that crashed)
//	stream N  streams N chunks of 40 bytes as fast as the node takes them
//	anything  answers "echo: <text>" in word-sized chunks, then its result
//
// Close ends a running turn's agent at once; a hung turn never ends on its
// own.
package fakebackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// Config configures the fake; its zero value is a claude-kind backend
// that answers at once.
type Config struct {
	// Kind is what the backend says it is; backend.BackendClaude when empty.
	Kind string
	// Delay is the pause between two chunks of an answer.
	Delay time.Duration
	// StartHang makes Start wait until its context ends, as an agent
	// whose handshake never answers.
	StartHang bool
	// StartDelay makes Start take that long, as an agent whose
	// handshake is slow.
	StartDelay time.Duration
}

// Backend starts fake agents. Its counters say what its agents were
// asked to do, across all of them.
type Backend struct {
	cfg                                 Config
	Starts, Prompts, Interrupts, Closes atomic.Int32

	mu       sync.Mutex
	sessions map[string]*Session
}

// New returns a fake backend.
func New(cfg Config) *Backend {
	if cfg.Kind == "" {
		cfg.Kind = backend.BackendClaude
	}
	return &Backend{cfg: cfg}
}

// Kind implements backend.Backend.
func (b *Backend) Kind() string { return b.cfg.Kind }

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Session, error) {
	b.Starts.Add(1)
	if b.cfg.StartHang {
		<-ctx.Done()
		return nil, fmt.Errorf("the agent never answered: %w", context.Cause(ctx))
	}
	if b.cfg.StartDelay > 0 {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the agent did not answer in time: %w", context.Cause(ctx))
		case <-time.After(b.cfg.StartDelay):
		}
	}
	s := &Session{b: b, cfg: b.cfg, sink: sink, id: spec.AgentID}
	b.mu.Lock()
	if b.sessions == nil {
		b.sessions = map[string]*Session{}
	}
	b.sessions[spec.AgentID] = s
	b.mu.Unlock()
	return s, nil
}

// Kill makes an agent die at once, as a CLI killed mid-turn would: an
// error, then status dead, and no result for a running turn.
func (b *Backend) Kill(agent string) {
	b.mu.Lock()
	s := b.sessions[agent]
	b.mu.Unlock()
	if s != nil {
		s.die()
	}
}

// Session is one fake agent.
type Session struct {
	b    *Backend
	cfg  Config
	sink backend.Sink
	id   string

	mu        sync.Mutex
	prompts   int
	running   bool
	interrupt chan struct{}
	dead      bool
	closing   bool
	wg        sync.WaitGroup
}

var errDead = errors.New("agent process is not running")

// Prompt implements backend.Session.
func (s *Session) Prompt(_ context.Context, _ int, text string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.dead:
		return errDead
	case s.running:
		return errors.New("the fake agent is still running a turn")
	}
	s.prompts++
	s.b.Prompts.Add(1)
	s.running, s.interrupt = true, make(chan struct{})
	s.wg.Add(1)
	go s.turn(text, s.interrupt)
	return nil
}

// Prompts is how many turns the session has been given.
func (s *Session) Prompts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prompts
}

func (s *Session) emit(p schemas.Payload) { s.sink.Emit(schemas.Event{Payload: p}) }

func (s *Session) turn(text string, interrupted <-chan struct{}) {
	defer s.wg.Done()
	verb, _, _ := strings.Cut(text, " ")
	switch verb {
	case "stall":
		s.emit(schemas.AssistantText{Delta: true, Content: schemas.Text("thinking about it")})
		<-interrupted
		s.end(schemas.StopCancelled)
		return
	case "stream":
		n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(text, verb)))
		const chunk = "a steady stream of tokens, forty bytes. "
		for range n {
			s.emit(schemas.AssistantText{Delta: true, Content: schemas.Text(chunk)})
		}
		s.emit(schemas.AssistantText{Content: schemas.Text(strings.Repeat(chunk, n))})
		s.end(schemas.StopEndTurn)
		return
	case "die":
		s.emit(schemas.AssistantText{Delta: true, Content: schemas.Text("about to ")})
		s.die()
		return
	}
	reply, delay := "echo: "+text, s.cfg.Delay
	if verb == "slow" {
		delay = max(delay, 40*time.Millisecond)
	}
	for _, w := range strings.SplitAfter(reply, " ") {
		select {
		case <-interrupted:
			s.end(schemas.StopCancelled)
			return
		case <-time.After(delay):
		}
		s.emit(schemas.AssistantText{Delta: true, Content: schemas.Text(w)})
	}
	s.emit(schemas.AssistantText{Content: schemas.Text(reply)})
	s.end(schemas.StopEndTurn)
}

func (s *Session) die() {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return
	}
	s.dead, s.running = true, false
	if s.interrupt != nil {
		select {
		case <-s.interrupt:
		default:
			close(s.interrupt) // a turn still waiting ends, saying nothing
		}
	}
	s.mu.Unlock()
	s.emit(schemas.Errorf("the fake agent fell over"))
	s.emit(schemas.Status{Status: schemas.StatusDead})
}

func (s *Session) end(stop schemas.StopReason) {
	s.mu.Lock()
	died := s.dead && !s.closing
	s.running = false
	s.mu.Unlock()
	if died {
		return // a dead agent's turn has no result
	}
	s.emit(schemas.Result{StopReason: stop, Usage: &schemas.Usage{InputTokens: 10, OutputTokens: 3, CostUSD: schemas.Cost(0)}})
}

// Interrupt implements backend.Session.
func (s *Session) Interrupt(context.Context) (bool, error) {
	s.b.Interrupts.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || s.dead {
		return false, nil
	}
	select {
	case <-s.interrupt:
	default:
		close(s.interrupt)
	}
	return true, nil
}

// Close implements backend.Session: a running turn ends, then status dead.
func (s *Session) Close(ctx context.Context) error {
	s.b.Closes.Add(1)
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return nil
	}
	s.dead, s.closing = true, true
	if s.running {
		select {
		case <-s.interrupt:
		default:
			close(s.interrupt)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.emit(schemas.Status{Status: schemas.StatusDead})
	return nil
}

// Info implements backend.Session.
func (s *Session) Info() backend.Info { return backend.Info{} }
