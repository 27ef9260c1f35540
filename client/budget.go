package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// SetBudget sets what an agent's turns, the fleet's or a label's nodes'
// may use (req names which); the node refuses a turn that would start
// past it and interrupts one that crosses it. A zero Tokens or USD lifts
// that limit; both zero lift the budget. A limit req keeps (KeepTokens,
// KeepUSD) stays as stored, the budget read and written at one revision.
func (f *Direct) SetBudget(ctx context.Context, req schemas.BudgetRequest) error {
	s, err := req.Scope()
	if err != nil {
		return err
	}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	if req.KeepTokens || req.KeepUSD {
		return f.mergeBudget(ctx, kv, s, req)
	}
	b := schemas.Budget{Tokens: req.Tokens, USD: req.USD}
	if b.IsZero() {
		if err := kv.Delete(ctx, s.Key()); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.Errf(schemas.CodeUnavailable, "lift %s's budget: %v", s, err)
		}
		return nil
	}
	v, err := json.Marshal(b)
	if err != nil {
		return schemas.Errf(schemas.CodeInvalid, "%s's budget %+v: %v", s, b, err)
	}
	if _, err := kv.Put(ctx, s.Key(), v); err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "set %s's budget: %v", s, err)
	}
	return nil
}

// mergeBudget sets the limits req gives of s's budget, keeping the others
// as stored: written at the revision read, read again when another write
// came between.
func (f *Direct) mergeBudget(ctx context.Context, kv jetstream.KeyValue, s schemas.Scope, req schemas.BudgetRequest) error {
	for try := 0; ; try++ {
		have, rev, err := budgetOf(ctx, kv, s.Key())
		if err != nil {
			return err
		}
		b := schemas.Budget{Tokens: req.Tokens, USD: req.USD}
		if req.KeepTokens {
			b.Tokens = have.Tokens
		}
		if req.KeepUSD {
			b.USD = have.USD
		}
		if b == (schemas.Budget{Tokens: have.Tokens, USD: have.USD}) && have.GrantedBy == "" {
			return nil // as it is
		}
		v, _ := json.Marshal(b)
		switch {
		case b.IsZero() && rev == 0:
			return nil
		case b.IsZero():
			err = kv.Delete(ctx, s.Key(), jetstream.LastRevision(rev))
		case rev == 0:
			_, err = kv.Create(ctx, s.Key(), v)
		default:
			_, err = kv.Update(ctx, s.Key(), v, rev)
		}
		if err == nil {
			return nil
		}
		if try >= 8 || ctx.Err() != nil {
			return schemas.Errf(schemas.CodeUnavailable, "set %s's budget: %v", s, err)
		}
	}
}

// BudgetValue reads key of the budgets bucket kv; found is false when it
// is not there. The node, the relay and the client read budgets with it.
func BudgetValue(ctx context.Context, kv jetstream.KeyValue, key string) (value []byte, found bool, err error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, schemas.Errf(schemas.CodeUnavailable, "read %s of %s: %v", key, schemas.BudgetsBucket, err)
	}
	return e.Value(), true, nil
}

// Budgets reads every budget with what was used against it (an agent's
// from its record, the fleet's and the labels' from the coordinator's
// count), and the count itself.
func (f *Direct) Budgets(ctx context.Context) (schemas.BudgetsReply, error) {
	rep := schemas.BudgetsReply{Budgets: []schemas.BudgetLine{}}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return rep, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	// The bucket in one pass: a budget a line, not a read each.
	values := map[string][]byte{}
	if err := eachValue(ctx, kv, func(k string, v []byte) { values[k] = v }); err != nil {
		return rep, schemas.Errf(schemas.CodeUnavailable, "read %s: %v", schemas.BudgetsBucket, err)
	}
	decode := func(key string, v any) bool {
		return values[key] != nil && json.Unmarshal(values[key], v) == nil
	}
	if b := values[schemas.SpentKey]; b != nil && json.Unmarshal(b, &rep.Spent) != nil {
		return rep, schemas.Errf(schemas.CodeInternal, "%s of %s does not decode", schemas.SpentKey, schemas.BudgetsBucket)
	}
	names := slices.Sorted(maps.Keys(values))
	var agentIDs []string
	for _, k := range names {
		if _, isLabel := schemas.LabelOfBudgetKey(k); !isLabel && !strings.HasPrefix(k, "_") {
			agentIDs = append(agentIDs, k)
		}
	}
	used := f.agentsUse(ctx, agentIDs)
	for _, k := range names {
		var line schemas.BudgetLine
		switch label, isLabel := schemas.LabelOfBudgetKey(k); {
		case k == schemas.SpentKey:
			continue
		case k == schemas.FleetBudgetKey:
			line.Fleet, line.Used = true, rep.Spent.Fleet()
		case isLabel:
			line.Label, line.Used = label, rep.Spent.Label(label)
		case strings.HasPrefix(k, "_"):
			continue
		default:
			line.AgentID, line.Used = k, used[k]
		}
		if !decode(k, &line.Budget) {
			continue
		}
		rep.Budgets = append(rep.Budgets, line)
	}
	return rep, nil
}

// agentsUse is what each of ids used in all its lives, from its record:
// a read of each for a few, one pass over the records for more.
func (f *Direct) agentsUse(ctx context.Context, ids []string) map[string]schemas.Usage {
	used := map[string]schemas.Usage{}
	if len(ids) <= 16 {
		for _, id := range ids {
			if rec, err := f.Record(ctx, id); err == nil {
				used[id] = rec.AllLives()
			}
		}
		return used
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return used
	}
	eachValue(ctx, kv, func(k string, v []byte) {
		var rec schemas.AgentRecord
		if want[k] && json.Unmarshal(v, &rec) == nil {
			used[k] = rec.AllLives()
		}
	})
	return used
}

// SetBudget implements Client.
func (r *Remote) SetBudget(ctx context.Context, req schemas.BudgetRequest) error {
	if _, err := req.Scope(); err != nil {
		return err
	}
	var none struct{}
	return r.via(ctx, schemas.VerbBudget, req, &none, 0)
}

// Budgets implements Client: page by page, in key order. A coordinator
// of an earlier version refuses pages, and is asked for them whole.
func (r *Remote) Budgets(ctx context.Context) (schemas.BudgetsReply, error) {
	all := schemas.BudgetsReply{Budgets: []schemas.BudgetLine{}}
	req := schemas.BudgetsRequest{Paged: true}
	for {
		rep := schemas.BudgetsReply{Budgets: []schemas.BudgetLine{}}
		err := r.via(ctx, schemas.VerbBudgets, req, &rep, 0)
		if schemas.CodeOf(err) == schemas.CodeInvalid && strings.Contains(err.Error(), "Unknown parameter(s)") {
			rep = schemas.BudgetsReply{Budgets: []schemas.BudgetLine{}}
			return rep, r.via(ctx, schemas.VerbBudgets, struct{}{}, &rep, 0)
		}
		if err != nil {
			return all, err
		}
		if req.After == "" {
			all.Spent = rep.Spent
		}
		all.Budgets = append(all.Budgets, rep.Budgets...)
		if rep.Next == "" {
			return all, nil
		}
		if rep.Next <= req.After {
			return all, schemas.Errf(schemas.CodeInternal, "the coordinator's budgets went back (next %q after %q)", rep.Next, req.After)
		}
		req.After = rep.Next
	}
}

// drawOnParent holds the budget of an agent's child (req names its
// parent) to what the parent may still spend, and takes it out of the
// parent's budget: a family of agents spends no more than the budget of
// the agent it grew from, as an agent raises no budget and opening
// children was a way around its own. A parent under a budget gives each
// child one, less than what it has left; a parent without one gives what
// the open asks. The child's budget is written here, marked as its
// parent's gift (granted_by); a reopened child's new life may spend what
// it is given on top of what its lives used. A budget a person set on the
// id (none marked) is not raised: the parent gives no more than it
// leaves, and the child keeps no more of it than the parent gives. Nothing is drawn or written for an id in
// use (a retry of this same open, or another's agent): the open answers
// which. A stale claim is no id in use (claim takes it over). undo puts back what was taken and written, for an open that did
// not happen.
func (f *Direct) drawOnParent(ctx context.Context, req *schemas.OpenRequest) (undo func(context.Context), err error) {
	nothing := func(context.Context) {}
	want := schemas.Budget{Tokens: req.BudgetTokens, USD: req.BudgetUSD}
	req.BudgetTokens, req.BudgetUSD = 0, 0 // written here, or not at all
	child, _, err := f.record(ctx, req.ID)
	switch {
	case schemas.CodeOf(err) == schemas.CodeNotFound:
		child = schemas.AgentRecord{}
	case err != nil:
		return nil, err
	case child.Status != schemas.StatusDead && child.Status != schemas.StatusClosed && !staleClaim(child):
		// In use (a claim its node never took up is not: the open
		// takes it over).
		return nothing, nil
	}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	before, beforeRev, err := budgetOf(ctx, kv, req.ID)
	if err != nil {
		return nil, err
	}
	childUsed := child.AllLives()
	var gives schemas.Budget // the child's budget, as written
	if !before.IsZero() && before.GrantedBy == "" {
		// A person's: the parent gives at most what it leaves, and the
		// child gets no more of it than the parent gives. What it gets
		// stays a person's budget, which no later open raises.
		want = want.Within(before.Left(childUsed))
		gives = before.Within(want.After(childUsed))
	} else if !want.IsZero() {
		gives = want.After(childUsed)
		gives.GrantedBy = req.Parent
	}
	// The child's budget is written first, at the revision read (a gift
	// even when it reads the same: it is this open's): of two opens of one
	// id at once, the second finds it changed and draws nothing. What was
	// written is put back only while it is still what this open wrote, so
	// an open that failed never takes away the budget of one that did not.
	mine := gives != before || gives.GrantedBy != ""
	wrote := beforeRev
	put := func(ctx context.Context, b schemas.Budget, at uint64) (uint64, error) {
		var err error
		switch v, _ := json.Marshal(b); {
		case b.IsZero() && at == 0:
			return 0, nil
		case b.IsZero():
			err = kv.Delete(ctx, req.ID, jetstream.LastRevision(at))
			return 0, err
		case at == 0:
			return kv.Create(ctx, req.ID, v)
		default:
			return kv.Update(ctx, req.ID, v, at)
		}
	}
	if mine {
		if wrote, err = put(ctx, gives, beforeRev); err != nil {
			return nil, schemas.Errf(schemas.CodeConflict, "agent %s's budget changed while it was being opened (another open of the id at once?): nothing was taken from agent %s's; open it again", req.ID, req.Parent)
		}
	}
	restore := func(ctx context.Context) {
		if mine {
			put(ctx, before, wrote) // only if still what this open wrote
		}
	}
	for try := 0; ; try++ {
		have, rev, err := budgetOf(ctx, kv, req.Parent)
		if err != nil {
			restore(context.WithoutCancel(ctx))
			return nil, err
		}
		if have.IsZero() {
			return restore, nil
		}
		parent, _, err := f.record(ctx, req.Parent)
		if err != nil {
			restore(context.WithoutCancel(ctx))
			return nil, err
		}
		used := parent.AllLives()
		if parent.Running != nil && parent.Status == schemas.StatusWorking {
			// The turn it opens its child from has used this much so far
			// (written within a second): it is not the child's to spend.
			used.Add(*parent.Running)
		}
		if !have.Grants(want, used) {
			restore(context.WithoutCancel(ctx))
			spent := fmt.Sprintf("%d tokens", schemas.TokensOf(used))
			if used.CostUSD != nil {
				spent += fmt.Sprintf(", $%.4f", *used.CostUSD)
			}
			return nil, schemas.Errf(schemas.CodeInvalid, "agent %s runs under a budget of %s and has used %s of it: its child's budget is taken out of what is left, so give the child one (budget_tokens, budget_usd) in each, less than what is left (asked: %s)",
				req.Parent, have, spent, want)
		}
		v, _ := json.Marshal(have.Less(want))
		if _, err := kv.Update(ctx, req.Parent, v, rev); err != nil {
			if try < 8 && ctx.Err() == nil {
				continue // another open of the family drew on it meanwhile
			}
			restore(context.WithoutCancel(ctx))
			return nil, schemas.Errf(schemas.CodeUnavailable, "take agent %s's child's budget out of its own: %v", req.Parent, err)
		}
		return func(ctx context.Context) {
			f.giveBack(ctx, kv, req.Parent, want)
			restore(ctx)
		}, nil
	}
}

// giveBack returns b to agent id's budget, for a child that did not open.
func (f *Direct) giveBack(ctx context.Context, kv jetstream.KeyValue, id string, b schemas.Budget) {
	for range 8 {
		have, rev, err := budgetOf(ctx, kv, id)
		if err != nil || have.IsZero() {
			return // lifted meanwhile: nothing to give back to
		}
		v, _ := json.Marshal(have.More(b))
		if _, err := kv.Update(ctx, id, v, rev); err == nil {
			return
		}
	}
}

// budgetOf reads key's budget of kv and the revision it was read at (0
// and a zero budget when there is none).
func budgetOf(ctx context.Context, kv jetstream.KeyValue, key string) (schemas.Budget, uint64, error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return schemas.Budget{}, 0, nil
	case err != nil:
		return schemas.Budget{}, 0, schemas.Errf(schemas.CodeUnavailable, "read %s of %s: %v", key, schemas.BudgetsBucket, err)
	}
	var b schemas.Budget
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return b, 0, schemas.Errf(schemas.CodeInternal, "%s of %s does not decode: %v", key, schemas.BudgetsBucket, err)
	}
	return b, e.Revision(), nil
}
