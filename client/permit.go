package client

import (
	"context"
	"encoding/json"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// Permit answers a permission request: the agent's node takes the first
// answer and refuses any later one as a conflict naming the first.
func (f *Direct) Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	if err := validAgent(req.AgentID); err != nil {
		return schemas.PermitReply{}, err
	}
	if err := schemas.ValidID(req.RequestID); err != nil {
		return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "permission request %v", err)
	}
	if _, err := schemas.ParseDecision(string(req.Decision)); err != nil {
		return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	var rep schemas.PermitReply
	err := f.toOwner(ctx, req.AgentID, schemas.VerbPermit, req, &rep, 0)
	if v := f.permitView(); v != nil && err == nil {
		v.answer(schemas.PermitKey(req.AgentID, req.RequestID))
	}
	if c := schemas.CodeOf(err); c == schemas.CodeNotFound || c == schemas.CodeUnavailable {
		// An answered request is told apart from one that never was.
		if rec, ok := f.permit(ctx, req.AgentID, req.RequestID); ok && rec.Answer != nil {
			a := rec.Answer
			return schemas.PermitReply{}, schemas.Errf(schemas.CodeConflict, "permission request %s of agent %s was already answered: %s by %s", req.RequestID, req.AgentID, a.Decision, a.By)
		}
		if rec, rerr := f.Record(ctx, req.AgentID); rerr == nil && rec.Status == schemas.StatusDead {
			// Its node lost (or stopped) with the request waiting: the
			// turn that asked is over, and nothing waits for the answer.
			return schemas.PermitReply{}, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead: its permission request %s went with the turn that asked (it stays listed until its deadline)", req.AgentID, req.RequestID)
		}
	}
	return rep, err
}

// permit reads one request from the bucket.
func (f *Direct) permit(ctx context.Context, agent, request string) (schemas.PermitRecord, bool) {
	kv, err := f.js.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		return schemas.PermitRecord{}, false
	}
	e, err := kv.Get(ctx, schemas.PermitKey(agent, request))
	if err != nil {
		return schemas.PermitRecord{}, false
	}
	var rec schemas.PermitRecord
	return rec, json.Unmarshal(e.Value(), &rec) == nil
}

// Pending lists the permission requests agents wait on, oldest first.
// Direct lists them all: it has no reply to fit them in. A client that
// watches them (WatchPermits) lists them from memory.
func (f *Direct) Pending(ctx context.Context) (schemas.PendingReply, error) {
	if v := f.permitView(); v != nil {
		return schemas.PendingReply{Requests: v.list()}, nil
	}
	kv, err := f.js.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		return schemas.PendingReply{}, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.PermitsBucket, err)
	}
	service.LongWait(ctx) // every request, answered or not
	out := []schemas.PermitRecord{}
	if err := eachValue(ctx, kv, func(_ string, v []byte) {
		var rec schemas.PermitRecord
		if json.Unmarshal(v, &rec) == nil && rec.Answer == nil {
			out = append(out, rec)
		}
	}); err != nil {
		return schemas.PendingReply{}, schemas.Errf(schemas.CodeUnavailable, "read %s: %v", schemas.PermitsBucket, err)
	}
	sortPermits(out)
	return schemas.PendingReply{Requests: out}, nil
}

// permitView is the client's watched view of the requests waiting, if it
// keeps one.
func (f *Direct) permitView() *permitView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.permits
}

// Permit implements Client.
func (r *Remote) Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	// Who answers is the fabric service's to say (by is read-only there).
	req.By = ""
	var rep schemas.PermitReply
	return rep, r.via(ctx, schemas.VerbPermit, req, &rep, 0)
}

// Pending implements Client.
func (r *Remote) Pending(ctx context.Context) (schemas.PendingReply, error) {
	var rep schemas.PendingReply
	err := r.via(ctx, schemas.VerbPending, struct{}{}, &rep, 0)
	if rep.Requests == nil {
		rep.Requests = []schemas.PermitRecord{}
	}
	return rep, err
}
