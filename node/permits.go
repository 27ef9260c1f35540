package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// DefaultAskTimeout is how long a permission request waits for a person
// when neither the open nor the node says.
const DefaultAskTimeout = 10 * time.Minute

// permitBook holds the permission requests the node's agents wait on,
// and the answers they got while the agent lives, so a second answer is
// told who answered first. Open requests are also in permits.json, so a
// restarted node ends them denied.
//
// What it holds is bounded per agent, whatever its CLI asks: at most
// maxWaitingPermits requests wait (a CLI asking many at once, each with
// an input of up to 1 MiB, held goroutines, memory and the file, which is
// written whole at each request), and the latest maxAnsweredPermits
// answered ones are kept for telling a second answer who answered.
type permitBook struct {
	path     string
	mu       sync.Mutex
	reqs     map[string]*asked            // by PermitKey
	waiting  map[string]map[string]*asked // agent -> PermitKey -> a request not answered yet
	answered map[string][]string          // agent -> PermitKeys answered, oldest first
}

type asked struct {
	rec    schemas.PermitRecord
	answer chan schemas.PermitAnswer // the first answer, once
}

const (
	// maxWaitingPermits bounds an agent's requests waiting for a person,
	// as the relay bounds those of a node with credentials.
	maxWaitingPermits = 16
	// maxAnsweredPermits bounds the answered requests kept per agent.
	maxAnsweredPermits = 512
)

func newPermitBook(path string) *permitBook {
	return &permitBook{path: path, reqs: map[string]*asked{}, waiting: map[string]map[string]*asked{}, answered: map[string][]string{}}
}

// open records a request and returns where its answer comes, or nil when
// maxWaitingPermits of the agent's wait already.
func (b *permitBook) open(rec schemas.PermitRecord) *asked {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiting[rec.AgentID]) >= maxWaitingPermits {
		return nil
	}
	q := &asked{rec: rec, answer: make(chan schemas.PermitAnswer, 1)}
	key := schemas.PermitKey(rec.AgentID, rec.RequestID)
	b.reqs[key] = q
	if b.waiting[rec.AgentID] == nil {
		b.waiting[rec.AgentID] = map[string]*asked{}
	}
	b.waiting[rec.AgentID][key] = q
	b.saveLocked()
	return q
}

// answer settles a request with the first answer; a later one is refused
// with who answered. It returns the request as answered.
func (b *permitBook) answer(agent, request string, ans schemas.PermitAnswer) (schemas.PermitRecord, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.reqs[schemas.PermitKey(agent, request)]
	if !ok {
		return schemas.PermitRecord{}, schemas.Errf(schemas.CodeNotFound, "agent %s has no permission request %s", agent, request)
	}
	if a := q.rec.Answer; a != nil {
		return q.rec, schemas.Errf(schemas.CodeConflict, "permission request %s of agent %s was already answered: %s by %s at %s",
			request, agent, a.Decision, a.By, time.Unix(0, int64(a.At*1e9)).UTC().Format(time.RFC3339))
	}
	q.rec.Answer = &ans
	q.answer <- ans
	key := schemas.PermitKey(agent, request)
	delete(b.waiting[agent], key)
	if len(b.waiting[agent]) == 0 {
		delete(b.waiting, agent)
	}
	done := append(b.answered[agent], key)
	if len(done) > maxAnsweredPermits {
		delete(b.reqs, done[0])
		done = done[1:]
	}
	b.answered[agent] = done
	b.saveLocked()
	rec := q.rec
	q.rec.Input = nil // kept to say who answered, not what was asked
	return rec, nil
}

// settleOne answers one request with the node's own answer, mine, and
// says what its answer is: a person's that came first, or mine, also
// when the book no longer holds the request (its agent was retired,
// which forgets its requests, while the request's wait was ending).
func (b *permitBook) settleOne(agent, request string, mine schemas.PermitAnswer) schemas.PermitAnswer {
	got, err := b.answer(agent, request, mine)
	if err != nil && got.Answer != nil {
		return *got.Answer
	}
	return mine
}

// settle denies every open request of an agent, by the node, saying why:
// it is being closed, or its turn interrupted.
func (b *permitBook) settle(agent, by, why string) {
	b.mu.Lock()
	var open []string
	for _, q := range b.waiting[agent] {
		open = append(open, q.rec.RequestID)
	}
	b.mu.Unlock()
	for _, r := range open {
		b.answer(agent, r, schemas.PermitAnswer{Decision: schemas.DecisionDeny, Message: why, By: by, At: unixTime(time.Now())})
	}
}

// forget drops an agent's requests when it is gone.
func (b *permitBook) forget(agent string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.waiting[agent] {
		delete(b.reqs, k)
	}
	for _, k := range b.answered[agent] {
		delete(b.reqs, k)
	}
	delete(b.waiting, agent)
	delete(b.answered, agent)
	b.saveLocked()
}

// saveLocked writes the open requests to permits.json.
func (b *permitBook) saveLocked() {
	var open []schemas.PermitRecord
	for _, reqs := range b.waiting {
		for _, q := range reqs {
			open = append(open, q.rec)
		}
	}
	data, _ := json.Marshal(open)
	tmp := b.path + ".tmp"
	if os.WriteFile(tmp, data, 0o600) == nil {
		os.Rename(tmp, b.path)
	}
}

// leftOver reads the requests a previous run of the node left open, and
// forgets them.
func (b *permitBook) leftOver() []schemas.PermitRecord {
	var open []schemas.PermitRecord
	if data, err := os.ReadFile(b.path); err == nil {
		json.Unmarshal(data, &open)
	}
	os.Remove(b.path)
	return open
}

func unixTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Ask implements backend.Asker: the request is recorded, published as a
// permission event and in PermitsBucket, and waits for the first answer
// (agent_permit), its deadline or the agent's end; its answer is
// published as a second permission event with the same request id.
func (a *agent) Ask(ctx context.Context, q backend.Question) backend.Verdict {
	h := a.h
	now := time.Now()
	wait := a.askTimeout
	rec := schemas.PermitRecord{
		AgentID: a.id, RequestID: "perm-" + schemas.NewAgentID(), Node: h.cfg.Name,
		Tool: q.Tool, ToolCallID: q.ToolCallID, Input: q.Input, Description: q.Description,
		Options: q.Options, AskedAt: unixTime(now), Deadline: unixTime(now.Add(wait)),
	}
	if rec.Options == nil {
		rec.Options = []schemas.PermissionOption{}
	}
	req := h.permits.open(rec)
	if req == nil {
		why := fmt.Sprintf("%d permission requests of agent %s wait for a person already, the most one agent may have: this one (%s) is denied", maxWaitingPermits, a.id, q.Tool)
		a.Emit(schemas.Event{Payload: schemas.Errorf("%s", why)})
		return backend.Verdict{Message: why}
	}
	perm := schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: q.ToolCallID}, Options: rec.Options,
		RequestID: rec.RequestID, Tool: q.Tool, Input: q.Input}
	a.Emit(schemas.Event{Payload: perm})
	h.putPermit(ctx, rec)
	a.log.Info("a permission request waits for a person", "request", rec.RequestID, "tool", q.Tool)

	timer := time.NewTimer(wait)
	defer timer.Stop()
	var ans schemas.PermitAnswer
	// The node's own answer, unless a person's came first.
	settle := func(by, why string) schemas.PermitAnswer {
		return h.permits.settleOne(a.id, rec.RequestID, schemas.PermitAnswer{Decision: schemas.DecisionDeny, Message: why, By: by, At: unixTime(time.Now())})
	}
	select {
	case ans = <-req.answer:
	case <-timer.C:
		ans = settle("deadline", fmt.Sprintf("nobody answered within %s, so the request was denied", wait))
	case <-ctx.Done():
		ans = settle("closed", "the turn or the agent ended before anyone answered")
	}
	if ans.Decision == schemas.DecisionDeny && ans.Message == "" {
		ans.Message = "denied by " + ans.By
	}
	answered := perm
	answered.Answer = &ans
	a.Emit(schemas.Event{Payload: answered})
	h.putPermit(ctx, schemas.Answered(rec, ans))
	return backend.Verdict{Allow: ans.Decision == schemas.DecisionAllow, Option: ans.Option, Message: ans.Message, Input: ans.Input}
}

// putPermit mirrors a request in PermitsBucket, for every surface to list.
// It writes even when ctx has ended (an answer made because the agent
// did), within a bound of its own.
func (h *Host) putPermit(ctx context.Context, rec schemas.PermitRecord) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := h.store.putPermit(ctx, schemas.FitPermit(rec)); err != nil {
		h.log.Warn("cannot write a permission request to the fabric", "agent", rec.AgentID, "request", rec.RequestID, "err", err)
	}
}

// Permit answers a permission request of one of the node's agents
// (agent_permit): exactly once; a second answer is a conflict that names
// the first.
func (h *Host) Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	if err := schemas.ValidID(req.AgentID); err != nil {
		return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	if req.RequestID == "" {
		return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "request_id is required")
	}
	d, err := schemas.ParseDecision(string(req.Decision))
	if err != nil {
		return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	by := req.By
	if by == "" {
		by = "someone"
	}
	h.permits.mu.Lock()
	q, ok := h.permits.reqs[schemas.PermitKey(req.AgentID, req.RequestID)]
	var opts []schemas.PermissionOption
	if ok {
		opts = q.rec.Options
	}
	h.permits.mu.Unlock()
	if ok && req.Option != "" {
		found := false
		for _, o := range opts {
			if o.OptionID == req.Option {
				found = true
				if d == schemas.DecisionAllow && !isAllow(o.Kind) || d == schemas.DecisionDeny && isAllow(o.Kind) {
					return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "option %s is a %s option, not one to %s with", o.OptionID, o.Kind, d)
				}
			}
		}
		if !found {
			return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "permission request %s has no option %q", req.RequestID, req.Option)
		}
	}
	if len(req.Input) > 0 {
		var obj map[string]any
		switch {
		case d != schemas.DecisionAllow:
			return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "input replaces what an allowed tool runs with; a denial has none")
		case json.Unmarshal(req.Input, &obj) != nil:
			return schemas.PermitReply{}, schemas.Errf(schemas.CodeInvalid, "input must be a JSON object, the tool's arguments")
		}
	}
	rec, err := h.permits.answer(req.AgentID, req.RequestID, schemas.PermitAnswer{
		Decision: d, Option: req.Option, Message: req.Message, Input: req.Input, By: by, At: unixTime(time.Now()),
	})
	if err != nil {
		return schemas.PermitReply{}, err
	}
	return schemas.PermitReply{Record: rec}, nil
}

func isAllow(k schemas.PermissionKind) bool {
	return k == schemas.PermissionAllowOnce || k == schemas.PermissionAllowAlways
}
