package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// SetBudget sets what an agent's turns, the fleet's or a label's nodes'
// may use (req names which); the node refuses a turn that would start
// past it and interrupts one that crosses it. A zero Tokens or USD lifts
// that limit; both zero lift the budget.
func (f *Direct) SetBudget(ctx context.Context, req schemas.BudgetRequest) error {
	s, err := req.Scope()
	if err != nil {
		return err
	}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	b := schemas.Budget{Tokens: req.Tokens, USD: req.USD}
	if b.IsZero() {
		if err := kv.Delete(ctx, s.Key()); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.Errf(schemas.CodeUnavailable, "lift %s's budget: %v", s, err)
		}
		return nil
	}
	v, _ := json.Marshal(b)
	if _, err := kv.Put(ctx, s.Key(), v); err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "set %s's budget: %v", s, err)
	}
	return nil
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
	get := func(key string, v any) (bool, error) {
		b, found, err := BudgetValue(ctx, kv, key)
		if err != nil || !found {
			return false, err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return false, schemas.Errf(schemas.CodeInternal, "%s of %s does not decode: %v", key, schemas.BudgetsBucket, err)
		}
		return true, nil
	}
	if _, err := get(schemas.SpentKey, &rep.Spent); err != nil {
		return rep, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return rep, schemas.Errf(schemas.CodeUnavailable, "list %s: %v", schemas.BudgetsBucket, err)
	}
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
	}
	slices.Sort(names)
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
			line.AgentID = k
			if rec, err := f.Record(ctx, k); err == nil {
				line.Used = rec.AllLives()
			}
		}
		if ok, err := get(k, &line.Budget); err != nil || !ok {
			continue // lifted meanwhile
		}
		rep.Budgets = append(rep.Budgets, line)
	}
	return rep, nil
}

// SetBudget implements Client.
func (r *Remote) SetBudget(ctx context.Context, req schemas.BudgetRequest) error {
	if _, err := req.Scope(); err != nil {
		return err
	}
	var none struct{}
	return r.via(ctx, schemas.VerbBudget, req, &none, 0)
}

// Budgets implements Client.
func (r *Remote) Budgets(ctx context.Context) (schemas.BudgetsReply, error) {
	rep := schemas.BudgetsReply{Budgets: []schemas.BudgetLine{}}
	return rep, r.via(ctx, schemas.VerbBudgets, struct{}{}, &rep, 0)
}
