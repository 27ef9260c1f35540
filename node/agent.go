package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/pngscale"
	"github.com/shoalfabric/shoal/schemas"
)

// agent is one session the node owns. Events from its backend and from the
// node itself go through one queue to a relay goroutine, which runs the
// status machine and publishes, logs and records each event in order.
type agent struct {
	h    *Host
	id   string
	log  *slog.Logger
	sess backend.Session

	queue *eventQueue
	done  chan struct{} // closed when the relay has handled status dead

	sendMu sync.Mutex // serialises sends, so turn numbers follow their order

	mu            sync.Mutex
	rec           schemas.AgentRecord
	seq           uint64 // the last event number used
	turnOpen      bool
	openTurn      int
	turnStarted   time.Time
	lastEvent     time.Time
	watchdog      string // why the watchdog fired for the open turn, "" if it has not
	closing       bool
	dead          bool
	muted         bool // the fabric closed this agent's stream; publish nothing more
	outboxTurn    int  // the turn interrupted when the outbox filled
	droppedChunks int  // streamed chunks not kept while the outbox was full
	syncRun       bool
	thinking      strings.Builder // this block's streamed thought, for an empty authoritative copy
	partial       strings.Builder // this turn's streamed assistant text, for agent_output
	turnText      []string        // this turn's authoritative assistant texts, for agent_run
	waiters       map[int][]chan runOutcome
	eventLog      *os.File
	stderrLog     *os.File
	lastActivity  time.Time
}

// runOutcome is how a turn a synchronous run waits for ended.
type runOutcome struct {
	text string
	died bool
	seq  uint64 // the turn's last event
}

// Emit implements backend.Sink: it queues the event for the relay.
func (a *agent) Emit(ev schemas.Event) { a.queue.push(ev) }

// relay handles queued events until the agent is dead.
func (a *agent) relay() {
	defer close(a.done)
	for {
		ev, ok := a.queue.pop()
		if !ok {
			return
		}
		if a.process(ev) {
			return
		}
	}
}

// process handles one event and reports whether the agent is now dead.
func (a *agent) process(ev schemas.Event) bool {
	now := time.Now()
	a.mu.Lock()
	a.lastEvent = now
	a.lastActivity = now
	a.rec.LastActivity = unixSeconds(now)
	a.mu.Unlock()

	switch p := ev.Payload.(type) {
	case schemas.TurnStarted:
		a.mu.Lock()
		stale := a.turnOpen
		a.mu.Unlock()
		if stale {
			a.closeTurn("the backend started turn %d before ending turn %d", ev.Turn, a.openTurnNumber())
		}
		a.mu.Lock()
		a.turnOpen, a.openTurn, a.turnStarted, a.watchdog = true, ev.Turn, now, ""
		a.thinking.Reset()
		a.partial.Reset()
		a.turnText = nil
		a.rec.Status, a.rec.Turn = schemas.StatusWorking, ev.Turn
		a.mu.Unlock()
		a.publish(schemas.Event{Turn: ev.Turn, Payload: schemas.Status{Status: schemas.StatusWorking}}, false)
		a.publish(ev, true)
		a.h.recs.mark(a, true)
	case schemas.Result:
		a.mu.Lock()
		open := a.turnOpen && a.openTurn == ev.Turn
		a.mu.Unlock()
		if !open {
			a.log.Debug("dropping the result of a turn already closed", "turn", ev.Turn)
			return false
		}
		a.endTurn(ev)
	case schemas.Thought:
		if p.Delta {
			a.mu.Lock()
			a.thinking.WriteString(textOf(p.Content))
			a.mu.Unlock()
			a.publish(ev, false)
			break
		}
		a.mu.Lock()
		streamed := a.thinking.String()
		a.thinking.Reset()
		a.mu.Unlock()
		if p.Content.Type == schemas.ContentText && strings.TrimSpace(p.Content.Text) == "" {
			if strings.TrimSpace(streamed) == "" {
				return false // nothing to say: neither published nor logged
			}
			ev.Payload = schemas.Thought{Content: schemas.Text(streamed)}
		}
		a.publish(ev, true)
	case schemas.AssistantText:
		a.mu.Lock()
		if p.Delta {
			a.partial.WriteString(textOf(p.Content))
		} else if p.Content.Type == schemas.ContentText {
			a.turnText = append(a.turnText, p.Content.Text)
		}
		a.mu.Unlock()
		a.publish(ev, !p.Delta)
	case schemas.ToolResult:
		ev.Payload = a.shrinkImages(p)
		a.publish(ev, true)
	case schemas.UsageUpdate:
		a.mu.Lock()
		a.rec.Usage.Add(p.Usage)
		a.mu.Unlock()
		a.publish(ev, true)
	case schemas.Status:
		if p.Status == schemas.StatusDead {
			a.die(ev)
			return true
		}
		a.publish(ev, p.Status != schemas.StatusIdle && p.Status != schemas.StatusWorking)
	default:
		a.publish(ev, !ev.IsDelta())
	}
	return false
}

func (a *agent) openTurnNumber() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.openTurn
}

// endTurn publishes status idle then the result, and wakes a synchronous
// run waiting for the turn.
func (a *agent) endTurn(ev schemas.Event) {
	a.mu.Lock()
	a.turnOpen = false
	if r, ok := ev.Payload.(schemas.Result); ok && r.Usage != nil {
		a.rec.Usage.Add(*r.Usage)
	}
	if a.rec.Status == schemas.StatusWorking {
		a.rec.Status = schemas.StatusIdle
	}
	text := strings.Join(a.turnText, "\n")
	waiters := a.waiters[ev.Turn]
	delete(a.waiters, ev.Turn)
	a.mu.Unlock()
	a.publish(schemas.Event{Turn: ev.Turn, Payload: schemas.Status{Status: schemas.StatusIdle}}, false)
	a.publish(ev, true)
	a.h.recs.mark(a, true)
	a.mu.Lock()
	seq := a.seq
	a.mu.Unlock()
	for _, w := range waiters {
		w <- runOutcome{text: text, seq: seq}
	}
}

// closeTurn ends the open turn on the node's authority: an error saying
// why, then a cancelled result.
func (a *agent) closeTurn(format string, args ...any) {
	turn := a.openTurnNumber()
	a.publish(schemas.Event{Turn: turn, Payload: schemas.Errorf(format, args...)}, true)
	a.endTurn(schemas.Event{Turn: turn, Payload: schemas.Result{StopReason: schemas.StopCancelled}})
}

// die closes any open turn, publishes status dead and retires the agent.
func (a *agent) die(ev schemas.Event) {
	a.mu.Lock()
	open, closing, turn, why := a.turnOpen, a.closing, a.openTurn, a.watchdog
	a.mu.Unlock()
	if open {
		switch {
		case why != "":
			a.closeTurn("turn %d was stopped: %s", turn, why)
		case closing:
			a.closeTurn("the agent was closed during turn %d", turn)
		default:
			a.closeTurn("the agent process exited during turn %d", turn)
		}
	}
	a.mu.Lock()
	a.dead = true
	a.rec.Status = schemas.StatusDead
	waiters := a.waiters
	a.waiters = nil
	a.mu.Unlock()
	a.publish(ev, true)
	a.h.recs.mark(a, true)
	for _, ws := range waiters {
		for _, w := range ws {
			w <- runOutcome{died: true}
		}
	}
	a.closeFiles()
	a.h.retire(a)
}

// publish numbers an event, logs it when it is not a liveness-only chunk or
// a status transition (logged), and hands it to the publisher.
func (a *agent) publish(ev schemas.Event, logged bool) {
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
	now := time.Now()
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
	a.h.pub.enqueue(&outMsg{agent: a.id, seq: seq, msg: eventMsg(a.h.store.eventSubject(a.id), a.h.cfg.Name, a.id, seq, wire, now)})
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
	if a.sess != nil {
		info = a.sess.Info()
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
	a.rec.QueuesPrompts = info.QueuesPrompts
	r := a.rec
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

func (a *agent) status() schemas.AgentStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rec.Status
}

// fire is the watchdog acting on an open turn: it says why, interrupts
// the turn, and stops the agent if the turn has not ended after the grace
// period.
func (a *agent) fire(ctx context.Context, turn int, why string) {
	a.mu.Lock()
	if !a.turnOpen || a.openTurn != turn || a.watchdog != "" {
		a.mu.Unlock()
		return
	}
	a.watchdog = why
	a.mu.Unlock()
	a.Emit(schemas.Event{Turn: turn, Payload: schemas.Errorf("turn %d %s; interrupting it", turn, why)})
	ok, err := a.sess.Interrupt(ctx)
	if !ok || err != nil {
		a.log.Warn("watchdog: interrupt failed; stopping the agent", "turn", turn, "err", err)
		a.sess.Close(ctx)
		return
	}
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
	still := a.turnOpen && a.openTurn == turn
	if still {
		a.watchdog = fmt.Sprintf("%s, and it did not end within %s of the interrupt", why, a.h.cfg.InterruptGrace)
	}
	a.mu.Unlock()
	if still {
		a.log.Warn("watchdog: the turn did not end after the interrupt; stopping the agent", "turn", turn)
		a.sess.Close(ctx)
	}
}

func textOf(c schemas.ContentBlock) string {
	if c.Type == schemas.ContentText {
		return c.Text
	}
	return ""
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// eventQueue is an unbounded FIFO, so a backend never waits for the relay.
type eventQueue struct {
	mu     sync.Mutex
	items  []schemas.Event
	wake   chan struct{}
	closed bool
}

func newEventQueue() *eventQueue { return &eventQueue{wake: make(chan struct{}, 1)} }

func (q *eventQueue) push(ev schemas.Event) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.items = append(q.items, ev)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop waits for the next event; false once the queue is closed and empty.
func (q *eventQueue) pop() (schemas.Event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = schemas.Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return ev, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return schemas.Event{}, false
		}
		<-q.wake
	}
}

func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
