package node

import (
	"strings"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// turns is an agent's turn state, one value touched only under the
// agent's lock. The node numbers every turn, holds a turn sent while
// another runs, and gives the backend the next one only once the running
// one's result is published: the backend never sees two turns at once.
type turns struct {
	// last is the last turn numbered. A reopened id goes on from its
	// previous life's last turn, as its event numbers do.
	last int
	// running is the turn the backend has, 0 when none.
	running int
	// delivered says the backend has the running turn's prompt.
	delivered bool
	// interruptAsked says an interrupt came before the running turn's
	// prompt was delivered; it is sent once it is.
	interruptAsked bool
	// stopping says why the node is ending the running turn itself (the
	// watchdog, an agent that stopped reading), "" when it is not.
	stopping string
	// started is when the running turn began, for the watchdog.
	started time.Time
	// queue holds the turns numbered while another ran, in order.
	queue []pendingTurn
	// waiters are synchronous runs waiting for a turn to end.
	waiters map[int][]chan runOutcome
}

// pendingTurn is a turn numbered but not begun.
type pendingTurn struct {
	n    int
	text string
	// dropped says why it will not run (an interrupt, a close), "" when
	// it will. A dropped turn still gets its own turn_started and result,
	// in its place, so every reader sees each turn number begin and end.
	dropped string
	// unsure says the turn's number is not in the agent's record yet: it
	// does not begin, nor does any turn after it, until it is.
	unsure bool
}

// runOutcome is how a turn a synchronous run waits for ended.
type runOutcome struct {
	text string
	stop schemas.StopReason
	died bool
	seq  uint64 // the turn's last event
	// notBegun says why a turn dropped while held never began.
	notBegun string
}

// number numbers a new turn and returns it with what the agent should do
// now: begin it (true) or hold it until the running one ends.
// A held turn is unsure until sure says its number is recorded.
func (t *turns) number(text string) (pendingTurn, bool) {
	t.last++
	p := pendingTurn{n: t.last, text: text}
	if t.running != 0 || len(t.queue) > 0 {
		p.unsure = true
		t.queue = append(t.queue, p)
		return p, false
	}
	return p, true
}

// sure says held turn n's number is recorded: it may begin in its turn.
func (t *turns) sure(n int) {
	for i := range t.queue {
		if t.queue[i].n == n {
			t.queue[i].unsure = false
		}
	}
}

// unnumber takes back the last turn numbered, n, which could not be
// recorded: no caller was told it, so it is numbered again.
func (t *turns) unnumber(n int) {
	if t.last != n {
		return
	}
	t.last--
	if k := len(t.queue); k > 0 && t.queue[k-1].n == n {
		t.queue = t.queue[:k-1]
	}
	delete(t.waiters, n)
}

// held is how many numbered turns have not begun.
func (t *turns) held() int { return len(t.queue) }

// begin makes p the running turn.
func (t *turns) begin(p pendingTurn, now time.Time) {
	t.running, t.delivered, t.interruptAsked, t.stopping, t.started = p.n, false, false, "", now
}

// end retires the running turn and returns the waiters of n.
func (t *turns) end(n int) []chan runOutcome {
	if t.running == n {
		t.running, t.delivered, t.interruptAsked, t.stopping = 0, false, false, ""
	}
	ws := t.waiters[n]
	delete(t.waiters, n)
	return ws
}

// ready reports whether a held turn is there to begin (next would take
// one).
func (t *turns) ready() bool { return len(t.queue) > 0 && !t.queue[0].unsure }

// headDropped reports whether the first held turn will not run.
func (t *turns) headDropped() bool { return len(t.queue) > 0 && t.queue[0].dropped != "" }

// next takes the first held turn, if any is there and sure.
func (t *turns) next() (pendingTurn, bool) {
	if len(t.queue) == 0 || t.queue[0].unsure {
		return pendingTurn{}, false
	}
	p := t.queue[0]
	t.queue = t.queue[1:]
	return p, true
}

// drop marks every held turn as one that will not run, and reports
// whether there was any.
func (t *turns) drop(why func(n int) string) bool {
	any := false
	for i := range t.queue {
		if t.queue[i].dropped == "" {
			t.queue[i].dropped = why(t.queue[i].n)
			any = true
		}
	}
	return any
}

// wait registers a synchronous run's wait for turn n.
func (t *turns) wait(n int, ch chan runOutcome) {
	if t.waiters == nil {
		t.waiters = map[int][]chan runOutcome{}
	}
	t.waiters[n] = append(t.waiters[n], ch)
}

// turnText is what the node keeps of the running turn's output: its
// authoritative texts for agent_run, and its streamed thought for an
// empty authoritative one. (agent_output reads the stream.)
type turnText struct {
	thinking strings.Builder
	texts    []string
}

func (t *turnText) reset() {
	t.thinking.Reset()
	t.texts = nil
}
