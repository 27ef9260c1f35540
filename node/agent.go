package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/pngscale"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// agent is one session the node owns. Its state is touched only through
// its own methods, under mu. Everything that happens to it becomes an item
// in one queue, in the order it happened; its loop goroutine, the only
// publisher of its events, stamps each backend event with the turn it
// belongs to, runs the turn and status machine, and publishes, logs and
// records each event in order.
type agent struct {
	h    *Host
	id   string
	log  *slog.Logger
	sess backend.Session

	queue   *eventQueue
	done    chan struct{} // closed when the loop has handled status dead
	work    sync.WaitGroup
	endLife context.CancelFunc // ends the context the agent's goroutines run in
	// stopStart cancels its backend's start while it is still starting (a
	// close then ends the open); set under mu.
	stopStart context.CancelFunc

	// mu guards what follows. It comes after the host's h.mu in the lock
	// order: an agent never takes h.mu while holding it.
	// sendMu is held by a send from numbering its turn to echoing it.
	sendMu sync.Mutex
	// closedTurn is the turn that ran when the agent was closed, and
	// closedSaid that its error says so already.
	closedTurn int
	closedSaid bool
	// recMu is held while the agent's record is written.
	recMu         sync.Mutex
	mu            sync.Mutex
	rec           schemas.AgentRecord
	turns         turns
	text          turnText
	seq           uint64    // the last event number used
	stamp         int       // the turn the loop stamps backend events with
	lastEvent     time.Time // when the loop last handled something; rec.LastActivity says it in seconds
	closing       bool
	dead          bool
	muted         bool // the fabric closed this agent's stream; publish nothing more
	outboxTurn    int  // the turn interrupted when the outbox filled
	droppedChunks int  // streamed chunks not kept while the outbox was full
	syncRun       bool
	eventLog      *os.File
	stderrLog     *os.File
	ends          []func()      // undone when the agent is dead (its sandbox's proxy, its temp directory)
	askTimeout    time.Duration // how long its permission requests wait for a person
	reaper        *proc.Reaper  // the reaper that holds its processes, nil when none does
	spend         spendState
}

// item is one thing the loop handles: an event (from the backend, or the
// node's own with its turn set), or the start of a turn.
type item struct {
	ev      schemas.Event
	backend bool         // the backend's: stamped with the turn it belongs to
	begin   *pendingTurn // the node begins this turn
	failed  *promptFailure
	advance bool // the first held turn begins if none runs
	spend   bool // the running turn's use so far is held to its budgets
}

// promptFailure says the backend could not be given a turn.
type promptFailure struct {
	n   int
	err error
}

// Emit implements backend.Sink: the backend's events queue for the loop.
// A backend far ahead of the loop waits here, so it cannot pile up
// events the node has read but not yet numbered and journaled.
func (a *agent) Emit(ev schemas.Event) { a.queue.pushWait(item{ev: ev, backend: true}, a.done) }

// emit queues one of the node's own events.
func (a *agent) emit(turn int, p schemas.Payload) {
	a.queue.push(item{ev: schemas.Event{Turn: turn, Payload: p}})
}

// loop handles queued items until the agent is dead. ctx is the agent's
// lifetime: what the loop starts (a turn's prompt, a stop) runs in it.
func (a *agent) loop(ctx context.Context) {
	defer close(a.done)
	for {
		it, ok := a.queue.pop()
		if !ok {
			return
		}
		if a.handle(ctx, it) {
			a.queue.close()
			return
		}
	}
}

// handle handles one item and reports whether the agent is now dead.
func (a *agent) handle(ctx context.Context, it item) bool {
	if it.backend {
		// Before the event counts as the agent's activity: a wait for
		// the stream is not the CLI's silence.
		a.h.pub.hold(ctx)
	}
	now := time.Now()
	a.mu.Lock()
	a.lastEvent, a.rec.LastActivity = now, unixSeconds(now)
	a.mu.Unlock()
	switch {
	case it.begin != nil:
		a.begun(*it.begin)
		return false
	case it.failed != nil:
		a.promptFailed(ctx, *it.failed)
		return false
	case it.advance:
		a.advance(ctx)
		return false
	case it.spend:
		a.checkSpend(ctx)
		return false
	}
	ev := it.ev
	if it.backend {
		a.mu.Lock()
		ev.Turn = a.stamp
		a.mu.Unlock()
	}
	switch p := ev.Payload.(type) {
	case schemas.TurnStarted:
		return false // turns are the node's to start
	case schemas.Result:
		a.mu.Lock()
		running := a.turns.running
		a.mu.Unlock()
		if running == 0 {
			a.log.Debug("dropping a result when no turn runs")
			return false
		}
		ev.Turn = running
		a.finish(ctx, ev, p, "")
	case schemas.Thought:
		if p.Delta {
			a.mu.Lock()
			a.text.thinking.WriteString(textOf(p.Content))
			a.mu.Unlock()
			a.publishAt(now, ev, false)
			break
		}
		a.mu.Lock()
		streamed := a.text.thinking.String()
		a.text.thinking.Reset()
		a.mu.Unlock()
		if p.Content.Type == schemas.ContentText && strings.TrimSpace(p.Content.Text) == "" {
			if strings.TrimSpace(streamed) == "" {
				return false // nothing to say: neither published nor logged
			}
			ev.Payload = schemas.Thought{Content: schemas.Text(streamed)}
		}
		a.publishAt(now, ev, true)
	case schemas.AssistantText:
		if !p.Delta && p.Content.Type == schemas.ContentText {
			a.mu.Lock()
			a.text.texts = append(a.text.texts, p.Content.Text)
			a.mu.Unlock()
		}
		a.publishAt(now, ev, !p.Delta)
	case schemas.ToolResult:
		ev.Payload = a.shrinkImages(p)
		a.publishAt(now, ev, true)
	case schemas.UsageUpdate:
		a.mu.Lock()
		a.rec.Usage.Add(p.Usage)
		a.mu.Unlock()
		a.publishAt(now, ev, true)
	case schemas.Status:
		if p.Status == schemas.StatusDead {
			a.die(ctx, ev)
			return true
		}
		a.publishAt(now, ev, p.Status != schemas.StatusIdle && p.Status != schemas.StatusWorking)
	default:
		a.publishAt(now, ev, !ev.IsDelta())
	}
	return false
}

// begun publishes the start of turn p: status working, then turn_started.
func (a *agent) begun(p pendingTurn) {
	a.mu.Lock()
	a.stamp = p.n
	a.text.reset()
	a.spend.running = schemas.Usage{}
	a.rec.Status = schemas.StatusWorking
	a.mu.Unlock()
	a.publish(schemas.Event{Turn: p.n, Payload: schemas.Status{Status: schemas.StatusWorking}}, false)
	a.publish(schemas.Event{Turn: p.n, Payload: schemas.TurnStarted{}}, true)
	a.h.recs.mark(a, true)
}

// finish ends the running turn with its result (status idle, then the
// result), wakes the runs waiting for it, then begins the next held turn,
// publishing in their place the turns that were dropped.
// notBegun, when not empty, says why the turn never began (it was dropped
// while held).
func (a *agent) finish(ctx context.Context, ev schemas.Event, r schemas.Result, notBegun string) {
	if r.Usage != nil {
		if held, ok := r.Usage.Clamped(); !ok {
			u, cost := *r.Usage, "none"
			if u.CostUSD != nil {
				cost = fmt.Sprint(*u.CostUSD)
			}
			a.publish(schemas.Event{Turn: ev.Turn, Payload: schemas.Errorf(
				"the backend reported turn %d's usage out of range (input %d, output %d, cache read %d, cache creation %d tokens, cost %s): a figure is negative, or past %d tokens or $%g a turn; it is counted held to that range",
				ev.Turn, u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheCreationTokens, cost, int64(schemas.MaxTurnTokens), float64(schemas.MaxTurnCostUSD))}, true)
			r.Usage = &held
			ev.Payload = r
		}
	}
	a.mu.Lock()
	if r.Usage != nil {
		a.rec.Usage.Add(*r.Usage)
		a.h.produced.ran(*r.Usage)
	}
	// The turn's use is in Usage from now on: a record written before the
	// turn is over must not carry it as running too.
	a.spend.running = schemas.Usage{}
	// A turn that ends while the agent closes leaves it closing, not idle.
	idle := !a.closing
	if idle {
		a.rec.Status = schemas.StatusIdle
	}
	text := strings.Join(a.text.texts, "\n")
	// A turn the backend ends itself when the agent is closed (the claude
	// CLI does, at the end of its input) says why, as one that dies with
	// it does.
	sayClosed := a.closing && a.closedTurn == ev.Turn && !a.closedSaid && notBegun == ""
	if sayClosed {
		a.closedSaid = true
	}
	a.mu.Unlock()
	if sayClosed {
		a.publish(schemas.Event{Turn: ev.Turn, Payload: schemas.Errorf("the agent was closed during turn %d", ev.Turn)}, true)
	}
	if idle {
		a.publish(schemas.Event{Turn: ev.Turn, Payload: schemas.Status{Status: schemas.StatusIdle}}, false)
	}
	a.publish(ev, true)
	a.mu.Lock()
	waiters := a.turns.end(ev.Turn)
	seq := a.seq
	a.mu.Unlock()
	for _, w := range waiters {
		w <- runOutcome{text: text, stop: r.StopReason, seq: seq, notBegun: notBegun}
	}
	a.h.recs.mark(a, true)
	a.advance(ctx)
}

// advance begins the next held turn. A dropped one is published as begun
// and cancelled, in its place; its finish advances again, to the one
// after.
func (a *agent) advance(ctx context.Context) {
	a.mu.Lock()
	if a.turns.running != 0 || a.dead || a.closing || !a.turns.ready() {
		a.mu.Unlock()
		return
	}
	dropped := a.turns.headDropped()
	a.mu.Unlock()
	// Held to the budgets as they stand now, not as when it was sent. The
	// held turn stays at the head of the queue while they are read, so a
	// turn sent meanwhile is held behind it. One that will not run (an
	// interrupt or a close dropped it) reads none.
	var over error
	if !dropped {
		var err error
		if over, err = a.admit(ctx); err != nil {
			over = a.overLastRead("a held turn", err)
		}
	}
	a.mu.Lock()
	if a.turns.running != 0 || a.dead || a.closing {
		a.mu.Unlock()
		return
	}
	p, ok := a.turns.next()
	if !ok {
		a.mu.Unlock()
		return
	}
	if p.dropped == "" && over != nil {
		p.dropped = fmt.Sprintf("turn %d was refused before it began: %v", p.n, over)
	}
	a.turns.begin(p, time.Now())
	a.rec.Held = a.turns.held()
	a.mu.Unlock()
	// Recorded before its start is published, so whoever closes the
	// stream of a lost agent knows which turns began.
	if err := a.h.recs.writeNow(ctx, a); err != nil {
		a.log.Warn("cannot record that a held turn begins", "turn", p.n, "err", err)
	}
	a.begun(p)
	if p.dropped != "" {
		a.publish(schemas.Event{Turn: p.n, Payload: schemas.Errorf("%s", p.dropped)}, true)
		a.finish(ctx, schemas.Event{Turn: p.n, Payload: schemas.Result{StopReason: schemas.StopCancelled}}, schemas.Result{StopReason: schemas.StopCancelled}, p.dropped)
		return
	}
	a.prompt(ctx, p)
}

// prompt gives the backend the running turn's text, on its own goroutine,
// so neither the loop nor the caller waits on the agent; it is not
// bounded by whoever sent the turn, which has its answer already, but by
// promptWait. A failure comes back to the loop in order.
func (a *agent) prompt(ctx context.Context, p pendingTurn) {
	a.work.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), promptWait)
		defer cancel()
		err := a.sess.Prompt(ctx, p.n, p.text)
		if err != nil {
			a.queue.push(item{failed: &promptFailure{n: p.n, err: err}})
			return
		}
		a.mu.Lock()
		asked := a.turns.running == p.n && a.turns.interruptAsked
		if a.turns.running == p.n {
			a.turns.delivered = true
		}
		a.mu.Unlock()
		if asked {
			a.interruptRunning(ctx)
		}
	})
}

// promptWait bounds how long the backend may take to take a turn.
const promptWait = 2 * time.Minute

// promptFailed ends a turn the backend could not be given. An agent that
// stopped reading its input is stopped: nothing more can reach it.
func (a *agent) promptFailed(ctx context.Context, f promptFailure) {
	a.mu.Lock()
	running, closing := a.turns.running == f.n, a.closing
	a.mu.Unlock()
	if !running || closing {
		return // a closing agent's death ends the turn, saying so
	}
	// An agent whose process has ended, or is being stopped, takes no
	// turn again: its death ends this one, and a run of it hears that the
	// agent died, not that its turn was cancelled. One that stopped
	// reading, or whose input is closed (a broken pipe: a CLI that exited
	// or never started), is stopped, to the same end.
	switch {
	case errors.Is(f.err, proc.ErrExited), errors.Is(f.err, proc.ErrStopping):
		return
	case errors.Is(f.err, proc.ErrStalled), errors.Is(f.err, syscall.EPIPE):
		a.stopFor(ctx, fmt.Sprintf("the agent did not take turn %d (%v)", f.n, f.err))
		return
	}
	a.publish(schemas.Event{Turn: f.n, Payload: schemas.Errorf("turn %d could not be given to the agent: %v", f.n, f.err)}, true)
	a.finish(ctx, schemas.Event{Turn: f.n, Payload: schemas.Result{StopReason: schemas.StopCancelled}}, schemas.Result{StopReason: schemas.StopCancelled}, "")
}

// stopFor stops the agent on the node's own authority, saying why: the
// running turn is closed with that reason when the agent is gone.
func (a *agent) stopFor(ctx context.Context, why string) {
	a.mu.Lock()
	if a.dead {
		a.mu.Unlock()
		return
	}
	first := a.turns.stopping == ""
	if first {
		a.turns.stopping = why
	}
	running, turn := a.turns.running, max(a.turns.running, a.stamp)
	a.mu.Unlock()
	if first {
		a.log.Warn("stopping the agent", "why", why)
		if running == 0 { // otherwise the running turn's end says why
			a.emit(turn, schemas.Errorf("%s; the agent is stopped", why))
		}
	}
	a.work.Go(func() {
		// Not bounded by whoever asked: the stop goes to its end.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := a.sess.Close(ctx); err != nil {
			a.log.Warn("stopping the agent", "err", err)
		}
	})
}

// die closes the running turn and every held one, publishes status dead
// and retires the agent.
func (a *agent) die(ctx context.Context, ev schemas.Event) {
	a.mu.Lock()
	running, closing, why := a.turns.running, a.closing, a.turns.stopping
	held := a.turns.queue
	a.turns.queue = nil
	a.mu.Unlock()
	if running != 0 {
		var msg string
		switch {
		case why != "":
			msg = fmt.Sprintf("turn %d was stopped: %s", running, why)
		case closing:
			msg = fmt.Sprintf("the agent was closed during turn %d", running)
		default:
			msg = fmt.Sprintf("the agent process exited during turn %d", running)
		}
		// What the backend said the turn used before it died is counted
		// as a result's: in the agent's record, which its budget holds
		// it to, in the coordinator's count and in shoal usage.
		a.mu.Lock()
		var used *schemas.Usage
		if u := a.spend.running; u != (schemas.Usage{}) {
			used = &u
			a.rec.Usage.Add(u)
			a.h.produced.ran(u)
			a.spend.running = schemas.Usage{}
		}
		a.mu.Unlock()
		a.closeTurn(running, msg, used)
	}
	for _, p := range held {
		why := p.dropped
		if why == "" {
			why = fmt.Sprintf("turn %d was dropped: the agent ended before it began", p.n)
		}
		a.publish(schemas.Event{Turn: p.n, Payload: schemas.TurnStarted{}}, true)
		a.closeTurn(p.n, why, nil)
	}
	a.mu.Lock()
	a.dead = true
	a.rec.Status, a.rec.Held = schemas.StatusDead, 0
	ev.Turn = max(a.stamp, a.turns.last)
	waiters := a.turns.waiters
	a.turns.waiters = nil
	a.mu.Unlock()
	a.publish(ev, true)
	a.h.recs.mark(a, true)
	for _, ws := range waiters {
		for _, w := range ws {
			w <- runOutcome{died: true}
		}
	}
	a.closeFiles()
	a.h.retire(ctx, a)
}

// closeTurn ends turn n of an agent that is gone: an error saying why and
// a cancelled result (with used, what the turn used so far, when known),
// with no status idle, since the agent is not.
func (a *agent) closeTurn(n int, why string, used *schemas.Usage) {
	a.mu.Lock()
	a.stamp = max(a.stamp, n)
	a.mu.Unlock()
	a.publish(schemas.Event{Turn: n, Payload: schemas.Errorf("%s", why)}, true)
	a.publish(schemas.Event{Turn: n, Payload: schemas.Result{StopReason: schemas.StopCancelled, Usage: used}}, true)
	a.mu.Lock()
	if a.turns.running == n {
		a.turns.running = 0
	}
	a.mu.Unlock()
}

// enqueue numbers an event for the outbox: its number reserved in the
// numbers file first, then the event to the journal and on to the stream.
func (h *Host) enqueue(agent string, seq uint64, wire []byte, at time.Time) {
	if err := h.nums.reserve(agent, seq); err != nil {
		h.log.Error("cannot reserve event numbers on disk; a lost journal could not be told", "agent", agent, "err", err)
	}
	h.pub.enqueue(newOutMsg(h.store.eventSubject(agent), h.cfg.Name, agent, seq, wire, at))
}

// publish numbers an event, logs it when it is not a liveness-only chunk or
// a status transition (logged), and hands it to the publisher.
func (a *agent) publish(ev schemas.Event, logged bool) { a.publishAt(time.Now(), ev, logged) }

// publishAt is publish of an event made at now: the loop reads the clock
// once for each event it handles.
func (a *agent) publishAt(now time.Time, ev schemas.Event, logged bool) {
	if ev.IsDelta() && a.h.pub.saturated() {
		a.mu.Lock()
		a.droppedChunks++
		a.mu.Unlock()
		return // liveness only: the authoritative copy follows
	}
	env, err := schemas.Encode(ev)
	if err != nil {
		a.log.Error("cannot encode an event; it is dropped", "kind", ev.Kind(), "err", err)
		return
	}
	if logged {
		a.writeLog(env, now)
	}
	wire, err := fit(env, a.h.maxEvent)
	if err != nil {
		a.log.Error("cannot fit an event into a message", "kind", ev.Kind(), "err", err)
		wire, _ = schemas.Encode(schemas.Event{Turn: ev.Turn, Payload: schemas.Errorf("a %s event of %d bytes could not be cut to the message size limit; it is only in the node's event log", ev.Kind(), len(env))})
	}
	a.mu.Lock()
	if a.muted {
		a.mu.Unlock()
		return
	}
	a.seq++
	seq := a.seq
	a.mu.Unlock()
	a.h.enqueue(a.id, seq, wire, now)
	a.h.countEvent(ev)
}

// writeLog appends the event to <id>.events.jsonl as Kaimon's record
// {"ts","kind","turn","data"}: the envelope with a timestamp spliced in.
func (a *agent) writeLog(env []byte, at time.Time) {
	a.mu.Lock()
	f := a.eventLog
	a.mu.Unlock()
	if f == nil {
		return
	}
	line := make([]byte, 0, len(env)+32)
	line = append(line, `{"ts":`...)
	line = strconv.AppendFloat(line, unixSeconds(at), 'f', 6, 64)
	line = append(line, ',')
	line = append(line, env[1:]...)
	line = append(line, '\n')
	if _, err := f.Write(line); err != nil {
		a.log.Warn("cannot write the event log", "err", err)
	}
}

func (a *agent) closeFiles() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.eventLog != nil {
		a.eventLog.Close()
		a.eventLog = nil
	}
	if a.stderrLog != nil {
		a.stderrLog.Close()
		a.stderrLog = nil
	}
}

// shrinkImages downsamples the PNGs of a tool result to the node's limit.
func (a *agent) shrinkImages(p schemas.ToolResult) schemas.ToolResult {
	limit := a.h.cfg.ImageMaxLongEdge
	if limit <= 0 || len(p.Update.Content) == 0 {
		return p
	}
	content := make([]schemas.ToolCallContent, len(p.Update.Content))
	copy(content, p.Update.Content)
	for i, c := range content {
		if c.Type == schemas.ToolContentBlock && c.Content.Type == schemas.ContentImage && c.Content.MimeType == "image/png" {
			content[i].Content.Data = pngscale.ShrinkBase64(c.Content.Data, limit)
		}
	}
	p.Update.Content = content
	return p
}

// record returns a copy of the agent's status record, refreshed from its
// session.
func (a *agent) record() schemas.AgentRecord {
	var info backend.Info
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess != nil {
		info = sess.Info()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if info.SessionID != "" {
		a.rec.SessionID = info.SessionID
	}
	if info.Transcript != "" {
		t := info.Transcript
		a.rec.Transcript = &t
	}
	a.rec.Turn = a.turns.last
	a.rec.LastEvent = a.seq
	a.rec.QueuesPrompts = true // the node holds a turn sent while another runs, for every backend
	r := a.rec
	if u := a.spend.running; a.turns.running != 0 && u != (schemas.Usage{}) {
		r.Running = &u
	}
	if r.Policy != nil {
		p := *r.Policy
		r.Policy = &p
	}
	if r.Usage.CostUSD != nil {
		c := *r.Usage.CostUSD
		r.Usage.CostUSD = &c
	}
	return r
}

// status is the agent's status as its record has it.
func (a *agent) status() schemas.AgentStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rec.Status
}

func (a *agent) isDead() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dead
}

func (a *agent) lastActivityTime() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastEvent
}

// outboxFilled notes the running turn as the one the full outbox
// interrupts, and reports whether there is one.
func (a *agent) outboxFilled() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.turns.running == 0 {
		return false
	}
	a.outboxTurn = a.turns.running
	return true
}

// outboxDrained returns, and forgets, the turn the full outbox interrupted
// and the streamed chunks it did not keep.
func (a *agent) outboxDrained() (turn, dropped int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	turn, dropped = a.outboxTurn, a.droppedChunks
	a.outboxTurn, a.droppedChunks = 0, 0
	return turn, dropped
}

// currentTurn is the turn the agent's own notices are stamped with.
func (a *agent) currentTurn() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(a.stamp, a.turns.running)
}

// mute stops publishing for an agent whose stream the fabric closed.
// mute stops the agent publishing, and returns the last event number it
// handed out: no event after it is enqueued.
func (a *agent) mute() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.muted = true
	return a.seq
}

// due reports why the watchdog should act on the running turn, "" when
// it should not.
func (a *agent) due(now time.Time, idle, limit time.Duration) (turn int, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &a.turns
	if t.running == 0 || t.stopping != "" || a.dead {
		return 0, ""
	}
	switch {
	case limit > 0 && now.Sub(t.started) > limit:
		return t.running, fmt.Sprintf("ran longer than %s", limit)
	case idle > 0 && now.Sub(a.lastEvent) > idle:
		return t.running, fmt.Sprintf("produced no output for %s", idle)
	}
	return 0, ""
}

// fire is the watchdog acting on a running turn: it says why, interrupts
// the turn, and stops the agent if the interrupt cannot be delivered or
// the turn has not ended after the grace period.
func (a *agent) fire(ctx context.Context, turn int, why string) {
	a.mu.Lock()
	if a.turns.running != turn || a.turns.stopping != "" {
		a.mu.Unlock()
		return
	}
	a.turns.stopping = why
	a.mu.Unlock()
	a.emit(turn, schemas.Errorf("turn %d %s; interrupting it", turn, why))
	a.mu.Lock()
	delivered := a.turns.delivered
	if !delivered {
		a.turns.interruptAsked = true // sent once the prompt is delivered
	}
	a.mu.Unlock()
	ok, err := true, error(nil)
	if delivered {
		ok, err = a.sess.Interrupt(ctx)
	}
	if !ok || err != nil {
		a.mu.Lock()
		still := a.turns.running == turn
		a.turns.stopping = ""
		a.mu.Unlock()
		if still {
			a.stopFor(ctx, fmt.Sprintf("%s, and it could not be interrupted (%s)", why, orNone(err)))
		}
		return
	}
	a.stopIfStill(ctx, turn, why)
}

// stopIfStill stops the agent if turn, interrupted for why, is still
// running after the interrupt grace: a CLI that takes an interrupt and
// goes on is not let go on.
func (a *agent) stopIfStill(ctx context.Context, turn int, why string) {
	t := time.NewTimer(a.h.cfg.InterruptGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-a.done:
		return
	case <-ctx.Done():
		return
	}
	a.mu.Lock()
	still := a.turns.running == turn
	if still {
		a.turns.stopping = ""
	}
	a.mu.Unlock()
	if still {
		a.stopFor(ctx, fmt.Sprintf("%s, and it did not end within %s of the interrupt", why, a.h.cfg.InterruptGrace))
	}
}

func orNone(err error) string {
	if err == nil {
		return "the agent said no turn was running"
	}
	return err.Error()
}

func textOf(c schemas.ContentBlock) string {
	if c.Type == schemas.ContentText {
		return c.Text
	}
	return ""
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// eventQueue is the FIFO between an agent's backend and its loop. The
// node's own items never wait; a backend's wait while the queue holds
// queueAhead items.
type eventQueue struct {
	mu     sync.Mutex
	items  []item // items[head:] wait; the storage before head is reused
	head   int
	wake   chan struct{}
	room   chan struct{} // signalled when the loop takes an item
	closed bool
}

// queueAhead is how many events a backend may be ahead of its loop.
const queueAhead = 256

func newEventQueue() *eventQueue {
	return &eventQueue{wake: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// pushWait is push, waiting while the queue is full, until done closes.
func (q *eventQueue) pushWait(it item, done <-chan struct{}) {
	for {
		q.mu.Lock()
		full := len(q.items)-q.head >= queueAhead && !q.closed
		q.mu.Unlock()
		if !full {
			q.push(it)
			return
		}
		select {
		case <-q.room:
		case <-done:
			return
		}
	}
}

func (q *eventQueue) push(it item) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	if q.head > 0 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop waits for the next item; false once the queue is closed and empty.
func (q *eventQueue) pop() (item, bool) {
	for {
		q.mu.Lock()
		if q.head < len(q.items) {
			it := q.items[q.head]
			q.items[q.head] = item{}
			if q.head++; q.head == len(q.items) {
				q.items, q.head = q.items[:0], 0
			}
			q.mu.Unlock()
			select {
			case q.room <- struct{}{}:
			default:
			}
			return it, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return item{}, false
		}
		<-q.wake
	}
}

// close drops what is left: nothing is published after status dead.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.items, q.head = nil, 0
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
