package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

func (s *directStore) allowance(ctx context.Context, agent, instance string, labels []string) (schemas.Allowance, error) {
	// The bucket is looked up once: a turn's start costs the reads of its
	// budgets only.
	s.budgetsMu.Lock()
	kv := s.budgets
	if kv == nil {
		var err error
		if kv, err = s.js.KeyValue(ctx, schemas.BudgetsBucket); err != nil {
			s.budgetsMu.Unlock()
			return schemas.Allowance{}, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
		}
		s.budgets = kv
	}
	s.budgetsMu.Unlock()
	return schemas.AllowanceOf(agent, s.node, instance, labels, func(key string) ([]byte, bool, error) {
		return client.BudgetValue(ctx, kv, key)
	})
}

func (s *relayStore) allowance(ctx context.Context, agent, _ string, _ []string) (schemas.Allowance, error) {
	var a schemas.Allowance
	if err := s.ask(ctx, schemas.RelayBudget, nil, &a, agent); err != nil {
		return a, schemas.Errf(schemas.CodeUnavailable, "read agent %s's budgets through the relay: %v", agent, err)
	}
	return a, nil
}

// spendState is what an agent's turns are held to: the budgets as last
// read, and what the running turn has used so far.
type spendState struct {
	allow   schemas.Allowance // the budgets and the fleet's spend, as last read
	readAt  time.Time         // when allow was read
	reads   int               // the reads begun, so an older one lands on no newer
	reading bool              // a read of them is under way for the running turn
	running schemas.Usage     // the running turn's use so far, as the backend said it
	over    int               // the turn interrupted for crossing a budget
	queued  bool              // a check of the running turn waits in the loop
}

// budgetRead bounds a read of the budgets.
const budgetRead = 5 * time.Second

// budgetsFresh is how old the budgets a running turn is held to may be
// while it spends: a budget lowered meanwhile (by a person, or by the
// agent's own gift to a child it opened) holds the turn from then on.
const budgetsFresh = time.Second

// admit reads what a's next turn is held to and says whether a turn may
// start now: over names the budget it would start past (and how to raise
// it); err says the budgets could not be read.
func (a *agent) admit(ctx context.Context) (over, err error) {
	allow, n, err := a.readAllowance(ctx)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.spend.reads == n {
		// No read begun after it (a running turn's) is newer.
		a.spend.allow, a.spend.readAt = allow, time.Now()
	}
	own := a.rec.AllLives()
	a.mu.Unlock()
	return a.held(allow).Check(a.id, own, schemas.Usage{}), nil
}

// readAllowance reads what a's turns are held to, as its read number n.
func (a *agent) readAllowance(ctx context.Context) (allow schemas.Allowance, n int, err error) {
	ctx, cancel := context.WithTimeout(ctx, budgetRead)
	defer cancel()
	a.mu.Lock()
	a.spend.reads++
	n = a.spend.reads
	a.mu.Unlock()
	if allow, err = a.h.store.allowance(ctx, a.id, a.h.instance(), a.h.labels); err != nil {
		return allow, n, err
	}
	return allow, n, nil
}

// held is allow with this node's turns that the count it was read with
// does not hold counted all the same, as they stand now (the count is
// written a moment after each result is stored; while the coordinator is
// away, it is not read again, and the node's own agents' turns go on
// adding to it).
func (a *agent) held(allow schemas.Allowance) schemas.Allowance {
	return allow.WithUnseen(schemas.Unseen(a.h.producedUsage(), allow.Counted))
}

// reread reads the budgets again for the running turn, and has its use so
// far checked against them. A read that fails leaves them as they were.
func (a *agent) reread(ctx context.Context) {
	allow, n, err := a.readAllowance(ctx)
	a.mu.Lock()
	a.spend.reading, a.spend.readAt = false, time.Now()
	if err == nil && a.spend.reads == n {
		// No read begun after it (the next turn's admit) is newer.
		a.spend.allow = allow
	}
	queue := err == nil && !a.spend.queued
	a.spend.queued = a.spend.queued || queue
	a.mu.Unlock()
	if queue {
		a.queue.push(item{spend: true})
	}
}

// refuseOverBudget refuses a turn of a that would start past a budget,
// before anything reaches its CLI.
func (a *agent) refuseOverBudget(ctx context.Context) error {
	over, err := a.admit(ctx)
	if err != nil {
		return a.overLastRead("a turn", err)
	}
	return over
}

// overLastRead holds a turn whose budgets could not be read (err: the
// coordinator away, its relay too busy to answer in time) to those last
// read and the agent's own use as its record has it: one its turns took
// past its budget begins none. The turn reads them again as it spends.
// An agent whose budgets were never read (just opened, or taken up again
// after a node restart) has none to be held to: its turn is refused with
// err, as it would begin unbounded.
func (a *agent) overLastRead(what string, err error) error {
	a.mu.Lock()
	if a.spend.readAt.IsZero() {
		a.mu.Unlock()
		return err
	}
	over := a.held(a.spend.allow).Check(a.id, a.rec.AllLives(), schemas.Usage{})
	a.mu.Unlock()
	if over == nil {
		a.log.Warn("cannot read the budgets "+what+" is held to; it begins, within those last read", "err", err)
	}
	return over
}

// Spending implements backend.Spender: the running turn's use so far is
// held to the budgets in the loop.
func (a *agent) Spending(turnSoFar schemas.Usage) {
	turnSoFar, _ = turnSoFar.Clamped() // the result says so, if it stays out of range
	a.mu.Lock()
	a.spend.running = turnSoFar
	queue := !a.spend.queued
	a.spend.queued = true
	a.mu.Unlock()
	// In the record within a second: a node killed mid-turn leaves it
	// to whoever closes the turn.
	a.h.recs.mark(a, false)
	if queue {
		a.queue.push(item{spend: true})
	}
}

// checkSpend interrupts the running turn once its use so far takes the
// agent, the fleet or one of its node's labels past a budget, saying which
// in an error event (which says the turn passed its budget, not that it
// was interrupted: the turn may yet end on its own before the interrupt
// reaches the CLI); the turns held behind it are refused as they come to
// begin. The budgets are read again while the turn spends, at most every
// budgetsFresh, whether or not any held it when it began (a person caps a
// runaway agent that had none); the fleet's and the labels' spend is as it
// stood then, so turns running at once on other agents are not seen until
// they end.
func (a *agent) checkSpend(ctx context.Context) {
	a.mu.Lock()
	a.spend.queued = false
	n := a.turns.running
	if n == 0 || a.spend.over == n {
		a.mu.Unlock()
		return
	}
	var over error
	if a.spend.allow.Limits() {
		over = a.held(a.spend.allow).Check(a.id, a.rec.AllLives(), a.spend.running)
	}
	if over == nil {
		if !a.spend.reading && time.Since(a.spend.readAt) >= budgetsFresh {
			a.spend.reading = true
			a.work.Go(func() { a.reread(ctx) })
		}
		a.mu.Unlock()
		return
	}
	a.spend.over = n
	delivered := a.turns.delivered
	if !delivered {
		a.turns.interruptAsked = true // sent once the prompt is delivered
	}
	a.mu.Unlock()
	a.log.Info("interrupting a turn past its budget", "turn", n, "why", over)
	a.publish(schemas.Event{Turn: n, Payload: schemas.Errorf("turn %d passed its budget: %v", n, over)}, true)
	if delivered {
		a.work.Go(func() {
			if a.interruptRunning(ctx) {
				a.stopIfStill(ctx, n, fmt.Sprintf("turn %d passed its budget", n))
			}
		})
	}
}

// produced is what the turns of this life of the node used, as their
// results said: set against the coordinator's count of them (Spent), it
// tells what the count does not hold yet.
type produced struct {
	mu    sync.Mutex
	usage schemas.Usage
}

// ran counts a turn's result.
func (p *produced) ran(u schemas.Usage) {
	p.mu.Lock()
	p.usage.Add(u)
	p.mu.Unlock()
}

// producedUsage is what the turns of this life of the node used.
func (h *Host) producedUsage() schemas.Usage {
	h.produced.mu.Lock()
	defer h.produced.mu.Unlock()
	return h.produced.usage
}

// instance is this life of the node, as its entry says.
func (h *Host) instance() string {
	if h.ads == nil {
		return ""
	}
	h.ads.mu.Lock()
	defer h.ads.mu.Unlock()
	return h.ads.rec.Instance
}
