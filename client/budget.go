package client

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// SetBudget sets what agent id's turns may use in all; the node refuses a
// turn that would start past it. A zero Budget lifts it.
func (f *Direct) SetBudget(ctx context.Context, id string, b schemas.Budget) error {
	if err := validAgent(id); err != nil {
		return err
	}
	if b.Tokens < 0 || b.USD < 0 {
		return schemas.Errf(schemas.CodeInvalid, "a budget is not negative (tokens %d, usd %g)", b.Tokens, b.USD)
	}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	if b == (schemas.Budget{}) {
		if err := kv.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.Errf(schemas.CodeUnavailable, "lift agent %s's budget: %v", id, err)
		}
		return nil
	}
	v, _ := json.Marshal(b)
	if _, err := kv.Put(ctx, id, v); err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "set agent %s's budget: %v", id, err)
	}
	return nil
}

// Budget is agent id's budget; the zero Budget when it has none.
func (f *Direct) Budget(ctx context.Context, id string) (schemas.Budget, error) {
	var b schemas.Budget
	if err := validAgent(id); err != nil {
		return b, err
	}
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return b, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return b, nil
	}
	if err != nil {
		return b, schemas.Errf(schemas.CodeUnavailable, "read agent %s's budget: %v", id, err)
	}
	err = json.Unmarshal(e.Value(), &b)
	return b, err
}
