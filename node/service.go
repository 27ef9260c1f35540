package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
	"github.com/shoalfabric/shoal/service"
)

// endpoint is one control verb the node answers.
type endpoint struct {
	verb    schemas.Verb
	handler micro.Handler
}

// endpoints binds each verb to its operation through the request adapter
// (package service): every request checked against its schema (as the
// fabric's parts send it to a node), run on its own goroutine within the
// verb's deadline, so a long agent_run never holds up another request;
// state-changing verbs answer every retry of a request id with the first
// reply.
func (h *Host) endpoints(srv *service.Server) []endpoint {
	d := newDedupe(2 * time.Minute)
	run := func(r schemas.RunRequest) time.Duration {
		timeout := schemas.DefaultRunTimeout
		if t, err := schemas.RunTimeout(r.Timeout); err == nil {
			timeout = t
		}
		return timeout + 30*time.Second
	}
	fixed := func(d time.Duration) func(any) time.Duration { return func(any) time.Duration { return d } }
	return []endpoint{
		{schemas.VerbOpen, handle(srv, d, schemas.VerbOpen, "open_request", deadline[schemas.OpenRequest](fixed(h.cfg.OpenTimeout+10*time.Second)), func(r schemas.OpenRequest) string { return onAgent(r.ID, r.RequestID) }, h.OpenAgent)},
		{schemas.VerbSend, handle(srv, d, schemas.VerbSend, "send_request", nil, func(r schemas.SendRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.Send)},
		{schemas.VerbRun, handle(srv, d, schemas.VerbRun, "run_request", run, func(r schemas.RunRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.RunTurn)},
		{schemas.VerbStatus, handle(srv, nil, schemas.VerbStatus, "agent_request", nil, nil, h.AgentStatus)},
		{schemas.VerbList, handle(srv, nil, schemas.VerbList, "list_request", nil, nil, h.ListAgents)},
		{schemas.VerbInterrupt, handle(srv, d, schemas.VerbInterrupt, "agent_request", nil, func(r schemas.AgentRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.Interrupt)},
		{schemas.VerbClose, handle(srv, d, schemas.VerbClose, "agent_request", deadline[schemas.AgentRequest](fixed(time.Minute)), func(r schemas.AgentRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.CloseAgent)},
		{schemas.VerbSetModel, handle(srv, d, schemas.VerbSetModel, "set_model_request", deadline[schemas.SetModelRequest](fixed(time.Minute)), func(r schemas.SetModelRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.SetModel)},
		{schemas.VerbPermit, handle(srv, nil, schemas.VerbPermit, "permit_request", nil, nil, h.Permit)},
		{schemas.VerbDescribe, handle(srv, nil, schemas.VerbDescribe, "nodes_request", nil, nil, func(context.Context, struct{}) (schemas.NodeRecord, error) { return h.ads.record(), nil })},
		{schemas.VerbRepoHas, handle(srv, nil, schemas.VerbRepoHas, "repo_has_request", nil, nil, h.RepoHas)},
		{schemas.VerbDiff, handle(srv, nil, schemas.VerbDiff, "diff_request", deadline[schemas.DiffRequest](fixed(time.Minute)), nil, h.Diff)},
		{schemas.VerbWork, handle(srv, nil, schemas.VerbWork, "work_request", deadline[schemas.WorkRequest](fixed(10*time.Minute)), nil, h.Work)},
	}
}

// deadline adapts a deadline of any request to one of Req.
func deadline[Req any](f func(any) time.Duration) func(Req) time.Duration {
	return func(r Req) time.Duration { return f(r) }
}

// onAgent keys a request id by the agent it acts on, since callers (an
// MCP client, say) choose request ids themselves and may reuse one for
// another agent; "" when there is no request id.
func onAgent(agent, requestID string) string {
	if requestID == "" {
		return ""
	}
	return agent + "/" + requestID
}

// handle is the endpoint of verb: op run through the adapter, and, for
// state-changing verbs (d and requestID given), the first reply to every
// retry of a request id.
func handle[Req, Rep any](srv *service.Server, d *dedupe, verb schemas.Verb, schema string, deadline func(Req) time.Duration, requestID func(Req) string, op func(context.Context, Req) (Rep, error)) micro.Handler {
	return service.Handler(srv, service.Endpoint[Req]{
		Verb: verb, Schema: validate.MustFull(schema), Deadline: deadline,
		Handle: func(ctx context.Context, req Req, body []byte) service.Reply {
			do := func() (service.Reply, bool) {
				rep, err := op(ctx, req)
				code := schemas.CodeOf(err)
				// A failure that may pass (a node busy or away, a
				// timeout) is not kept: a retry tries again. Unless
				// the request acted already (a run's turn was sent):
				// a retry is answered as it was.
				_, acted := errors.AsType[sentTurn](err)
				return service.Encode(rep, err), acted || (code != schemas.CodeUnavailable && code != schemas.CodeTimeout)
			}
			if d != nil && requestID != nil && requestID(req) != "" {
				return d.do(string(verb)+"/"+requestID(req), body, func() { service.LongWait(ctx) }, do)
			}
			a, _ := do()
			return a
		},
	})
}

// dedupe answers every retry of a request id with the first reply, and
// makes a retry that arrives while the first is still running wait for it,
// so a retried request never acts twice.
type dedupe struct {
	window time.Duration

	mu      sync.Mutex
	entries map[string]*dedupeEntry
	swept   time.Time // when expired entries were last dropped
}

type dedupeEntry struct {
	done  chan struct{}
	reply service.Reply
	at    time.Time
	set   bool
	// body is the first request's digest, first when it came and head
	// what it was (its verb and agent, never its content): a retry
	// carries the same body, and a different one under the same id is
	// another request, refused.
	body  [sha256.Size]byte
	first time.Time
	head  string
}

func newDedupe(window time.Duration) *dedupe {
	return &dedupe{window: window, entries: map[string]*dedupeEntry{}}
}

// do runs fn for the first request of key, and answers the others with its
// reply; a retry that has to wait for the first announces it with notice.
// A request under the same key whose body differs is no retry: it is
// refused as a conflict naming the first.
func (d *dedupe) do(key string, body []byte, notice func(), fn func() (reply service.Reply, keep bool)) service.Reply {
	sum := sha256.Sum256(body)
	d.mu.Lock()
	now := time.Now()
	if now.Sub(d.swept) > d.window/8 {
		// Swept an eighth of the window at a time, not at every request:
		// a thousand agents opened at once are a thousand requests.
		d.swept = now
		for k, e := range d.entries {
			if e.set && now.Sub(e.at) > d.window {
				delete(d.entries, k)
			}
		}
	}
	if e, ok := d.entries[key]; ok && e.set && now.Sub(e.at) > d.window {
		delete(d.entries, key) // expired, not swept yet
	}
	if e, ok := d.entries[key]; ok {
		d.mu.Unlock()
		if e.body != sum {
			id := key // <verb>/<agent>/<request id>, and neither verb nor agent holds a '/'
			if parts := strings.SplitN(key, "/", 3); len(parts) == 3 {
				id = parts[2]
			}
			return service.Encode(nil, schemas.Errf(schemas.CodeConflict, "request id %s was used %s ago for another %s: a retry carries the same request; a new request needs a new request id",
				id, time.Since(e.first).Round(time.Millisecond), e.head))
		}
		select {
		case <-e.done:
		default:
			notice()
			<-e.done
		}
		return e.reply
	}
	e := &dedupeEntry{done: make(chan struct{}), body: sum, first: now, head: describeKey(key)}
	d.entries[key] = e
	d.mu.Unlock()
	rep, keep := fn()
	d.mu.Lock()
	e.reply, e.at, e.set = rep, time.Now(), true
	if !keep {
		delete(d.entries, key) // those waiting have it; later retries run again
	}
	d.mu.Unlock()
	close(e.done)
	return rep
}

// describeKey names the request a dedupe key stands for: its verb and its
// agent.
func describeKey(key string) string {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) < 3 {
		return "request"
	}
	return parts[0] + " request about agent " + parts[1]
}
