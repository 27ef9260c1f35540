package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// newAgent is an agent starting with the record rec.
func newAgent(h *Host, rec schemas.AgentRecord) *agent {
	now := time.Now()
	rec.CreatedAt, rec.LastActivity = unixSeconds(now), unixSeconds(now)
	return &agent{
		h:     h,
		id:    rec.ID,
		log:   h.log.With("agent", rec.ID),
		queue: newEventQueue(),
		done:  make(chan struct{}),
		rec:   rec, lastEvent: now,
	}
}

// resume goes on where the id's previous life ended: its event numbers and
// its turn numbers continue, after its stream's end and after what its
// claim carries of its earlier lives (the stream's retention may have
// dropped their events).
func (a *agent) resume(tail schemas.Tail) {
	a.mu.Lock()
	defer a.mu.Unlock()
	events, turns := a.rec.EventsBefore, a.rec.TurnsBefore
	a.seq, a.turns.last = max(tail.Last, events), max(tail.Turn, turns)
	a.stamp = a.turns.last
	a.rec.Turn = a.turns.last
}

// openFiles opens the agent's event log (truncated, as Kaimon does at
// every open) and its stderr log, which it returns for the backend.
func (a *agent) openFiles(stderrPath string) (*os.File, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var err error
	if a.eventLog, err = os.OpenFile(a.rec.EventLog, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600); err != nil {
		return nil, fmt.Errorf("open the event log: %w", err)
	}
	if a.stderrLog, err = os.OpenFile(stderrPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err != nil {
		a.eventLog.Close()
		a.eventLog = nil
		return nil, fmt.Errorf("open the stderr log: %w", err)
	}
	return a.stderrLog, nil
}

// started takes the backend's session: the loop runs from now on, in
// the agent's own lifetime, which outlives the open that began it and ends
// with the agent; and the agent is idle.
func (a *agent) started(ctx context.Context, sess backend.Session) {
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	a.mu.Lock()
	a.sess = sess
	a.endLife = end
	a.rec.Status = schemas.StatusIdle
	turn, sandbox, closing := a.turns.last, a.rec.Sandbox, a.closing
	a.mu.Unlock()
	a.h.agentWork.Go(func() {
		defer end()
		a.loop(life)
		a.work.Wait()
	})
	a.emit(turn, schemas.Status{Status: schemas.StatusIdle, Sandbox: sandbox})
	a.h.recs.mark(a, true)
	if closing { // a close came while it started
		a.emit(turn, schemas.Status{Status: schemas.StatusClosed})
		a.h.agentWork.Go(func() {
			ctx, cancel := context.WithTimeout(life, 30*time.Second)
			defer cancel()
			if err := sess.Close(ctx); err != nil {
				a.log.Warn("closing the agent", "err", err)
			}
		})
	}
}

// sandboxed records what the kernel confines this life to: the record
// and the life's first status event carry it.
func (a *agent) sandboxed(p *schemas.SandboxPolicy) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rec.Sandbox = p
}

// atEnd has fn run once the agent is dead.
func (a *agent) atEnd(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ends = append(a.ends, fn)
}

// ended runs what was to be undone at the agent's death.
func (a *agent) ended() {
	a.mu.Lock()
	ends := a.ends
	a.ends = nil
	a.mu.Unlock()
	for _, fn := range ends {
		fn()
	}
}

// noSession is the session of an agent whose backend never started.
type noSession struct{}

func (noSession) Prompt(context.Context, int, string) error {
	return errors.New("the agent did not start")
}
func (noSession) Interrupt(context.Context) (bool, error) { return false, nil }
func (noSession) Close(context.Context) error             { return nil }
func (noSession) Info() backend.Info                      { return backend.Info{} }

// send numbers a turn, records its number, echoes its text (stamped with
// the previous turn, as Kaimon does) and begins it, or holds it while
// another runs. The number is in the agent's record before the caller is
// told it, so a node lost at any moment after leaves it to be closed by
// whoever closes the agent's stream, and never numbered again. A waiter,
// when given, is registered for the turn before it can end.
func (a *agent) send(ctx context.Context, text string, waiter chan runOutcome) (int, error) {
	// One send at a time per agent: echoes go out in the order of the
	// numbers, each after its number is recorded.
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	a.mu.Lock()
	switch {
	case a.dead:
		a.mu.Unlock()
		return 0, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead", a.id)
	case a.closing:
		a.mu.Unlock()
		return 0, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is closing", a.id)
	case a.sess == nil:
		// Reserved, its backend not started: no session to take the turn.
		a.mu.Unlock()
		return 0, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is still starting: send the turn once it is idle", a.id)
	}
	p, now := a.turns.number(text)
	if waiter != nil {
		a.turns.wait(p.n, waiter)
	}
	a.rec.Turn, a.rec.Held = p.n, a.turns.held()
	a.mu.Unlock()
	err := a.h.recs.writeNow(ctx, a)
	a.mu.Lock()
	switch {
	case err == nil && a.closing:
		err = schemas.Errf(schemas.CodeUnavailable, "agent '%s' was closed as the turn was sent", a.id)
	case err == nil && a.dead:
		err = schemas.Errf(schemas.CodeUnavailable, "agent '%s' died as the turn was sent", a.id)
	case err != nil:
		err = schemas.Errf(schemas.CodeUnavailable, "cannot record turn %d in the agent's record: %v", p.n, err)
	}
	if err != nil {
		a.turns.unnumber(p.n)
		a.rec.Turn, a.rec.Held = a.turns.last, a.turns.held()
		a.mu.Unlock()
		a.h.recs.mark(a, true)
		return 0, err
	}
	a.turns.sure(p.n)
	a.queue.push(item{ev: schemas.Event{Turn: p.n - 1, Payload: schemas.UserText{Content: schemas.Text(text)}}})
	if !now && a.turns.running == 0 {
		// The running turn ended while the number was being recorded, and
		// nothing began since: this turn, the first held, begins in the
		// loop.
		a.queue.push(item{advance: true})
	}
	if now {
		a.turns.begin(p, time.Now())
		a.queue.push(item{begin: &p})
	}
	a.mu.Unlock()
	if now {
		a.prompt(ctx, p)
	}
	return p.n, nil
}

// interrupt ends the running turn and drops the held ones, reporting
// whether there was anything to end.
func (a *agent) interrupt(ctx context.Context) bool {
	a.mu.Lock()
	if a.dead {
		a.mu.Unlock()
		return false
	}
	dropped := a.turns.drop(func(n int) string { return fmt.Sprintf("turn %d was interrupted before it began", n) })
	running, delivered := a.turns.running, a.turns.delivered
	if running != 0 && !delivered {
		a.turns.interruptAsked = true // sent once the prompt is delivered
	}
	a.mu.Unlock()
	switch {
	case running == 0:
		return dropped
	case !delivered:
		return true
	}
	return a.interruptRunning(ctx) || dropped
}

// interruptRunning asks the backend to cancel the running turn. A cancel
// that cannot be delivered (an agent that stopped reading) stops the agent,
// which ends the turn all the same.
func (a *agent) interruptRunning(ctx context.Context) bool {
	ok, err := a.sess.Interrupt(ctx)
	// A request waiting for a person is answered once the turn is
	// cancelled: answered first, the turn went on to its next tool call
	// (a local model's) before the cancel reached it, and asked of that.
	a.h.permits.settle(a.id, "interrupted", "the turn was interrupted before anyone answered")
	if err != nil {
		a.stopFor(ctx, fmt.Sprintf("the interrupt could not be delivered (%v)", err))
		return true
	}
	return ok
}

// close closes the agent: status closed, the held turns dropped, and the
// backend stopped, whatever its stdin does. It returns once the agent is
// dead or ctx ends.
func (a *agent) close(ctx context.Context) {
	a.mu.Lock()
	if a.sess == nil {
		// Still starting: its start is cancelled, and the open ends (its
		// claim given back); one that started meanwhile is closed as it
		// starts. Either way the agent is over once done is closed. It
		// answered closed while the agent went on starting until the
		// open's timeout, its record saying starting.
		a.closing = true
		stop := a.stopStart
		a.mu.Unlock()
		if stop != nil {
			stop()
		}
		select {
		case <-a.done:
		case <-ctx.Done():
		}
		return
	}
	already := a.dead || a.closing
	a.closing = true
	a.turns.drop(func(n int) string { return fmt.Sprintf("turn %d was dropped: the agent was closed before it began", n) })
	// The turn it was on: the last begun, not the last held.
	turn := max(a.turns.running, a.stamp)
	if !already {
		a.closedTurn = a.turns.running
	}
	a.mu.Unlock()
	if !already {
		a.emit(turn, schemas.Status{Status: schemas.StatusClosed})
	}
	// A request waiting for a person would hold the CLI from ending.
	a.h.permits.settle(a.id, "closed", "the agent was closed before anyone answered")
	if err := a.sess.Close(ctx); err != nil {
		a.log.Warn("closing the agent", "err", err)
	}
	select {
	case <-a.done:
	case <-ctx.Done():
	}
}

// startRun takes the agent's one synchronous run, reporting whether it
// was free.
func (a *agent) startRun() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.syncRun {
		return false
	}
	a.syncRun = true
	return true
}

func (a *agent) endRun() {
	a.mu.Lock()
	a.syncRun = false
	a.mu.Unlock()
}

// lastSeq is the number of the agent's last event.
func (a *agent) lastSeq() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seq
}

// setModel records the model the backend now runs.
func (a *agent) setModel(model string) {
	a.mu.Lock()
	a.rec.Model = model
	a.mu.Unlock()
	a.h.recs.mark(a, true)
}
