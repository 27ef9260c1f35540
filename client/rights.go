package client

import (
	"context"

	"github.com/shoalfabric/shoal/schemas"
)

// Authorize asks schemas.Decide whether principal p may have access a to
// agent id ("" for a request about no agent), with what the fabric's
// records say of the target: for an agent principal (whose own record is
// self), how the target stands to it, and whether it runs sandboxed. It
// returns nil or a *schemas.ControlError (forbidden) that names the rule.
// An agent asking about an id that has no record is told the same as for
// an agent outside its reach, so it learns nothing of ids it may not see.
func Authorize(ctx context.Context, c Client, p schemas.Principal, self *schemas.AgentRecord, a schemas.Access, id, what string) error {
	t := schemas.Target{Agent: id}
	if p.Kind == schemas.KindAgent && id != "" && self != nil {
		target, err := c.Record(ctx, id)
		switch {
		case err == nil:
			t.Rel = schemas.Relate(*self, target, func(id string) (schemas.AgentRecord, error) { return c.Record(ctx, id) })
			t.Owner, t.Sandboxed, t.Confined = target.Node, target.Sandbox != nil, schemas.ConfinedOf(target)
		case schemas.CodeOf(err) == schemas.CodeNotFound:
			t.Rel = schemas.RelUnrelated
		default:
			return err
		}
	}
	return schemas.Decide(p, a, t).Err(p, what, t)
}

// Visible keeps of recs the agents principal p may read (self is an agent
// principal's own record). recs is taken as the whole fabric: lineages are
// traced within it.
func Visible(p schemas.Principal, self *schemas.AgentRecord, recs []schemas.AgentRecord) []schemas.AgentRecord {
	if p.Kind == schemas.KindPerson {
		return recs
	}
	byID := make(map[string]schemas.AgentRecord, len(recs))
	for _, r := range recs {
		byID[r.ID] = r
	}
	lookup := func(id string) (schemas.AgentRecord, error) {
		if r, ok := byID[id]; ok {
			return r, nil
		}
		return schemas.AgentRecord{}, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
	}
	out := []schemas.AgentRecord{}
	for _, r := range recs {
		t := schemas.Target{Agent: r.ID, Owner: r.Node, Sandboxed: r.Sandbox != nil, Confined: schemas.ConfinedOf(r)}
		if p.Kind == schemas.KindAgent && self != nil {
			t.Rel = schemas.Relate(*self, r, lookup)
		}
		if schemas.Decide(p, schemas.AccessRead, t).Allowed {
			out = append(out, r)
		}
	}
	return out
}
