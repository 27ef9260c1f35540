package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// endpoint is one control verb the node answers.
type endpoint struct {
	verb    schemas.Verb
	handler micro.Handler
}

// endpoints binds each verb to its operation. Every request is handled on
// its own goroutine, so a long agent_run never holds up another request,
// in a context of its own with the verb's deadline.
func (h *Host) endpoints(ctx context.Context) []endpoint {
	d := newDedupe(2 * time.Minute)
	return []endpoint{
		{schemas.VerbOpen, handle(ctx, h, d, schemas.VerbOpen, func(r schemas.OpenRequest) string { return onAgent(r.ID, r.RequestID) }, h.OpenAgent)},
		{schemas.VerbSend, handle(ctx, h, d, schemas.VerbSend, func(r schemas.SendRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.Send)},
		{schemas.VerbRun, handle(ctx, h, d, schemas.VerbRun, func(r schemas.RunRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.RunTurn)},
		{schemas.VerbStatus, handle(ctx, h, nil, schemas.VerbStatus, nil, h.AgentStatus)},
		{schemas.VerbList, handle(ctx, h, nil, schemas.VerbList, nil, h.ListAgents)},
		{schemas.VerbInterrupt, handle(ctx, h, d, schemas.VerbInterrupt, func(r schemas.AgentRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.Interrupt)},
		{schemas.VerbClose, handle(ctx, h, d, schemas.VerbClose, func(r schemas.AgentRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.CloseAgent)},
		{schemas.VerbSetModel, handle(ctx, h, d, schemas.VerbSetModel, func(r schemas.SetModelRequest) string { return onAgent(r.AgentID, r.RequestID) }, h.SetModel)},
		{schemas.VerbPermit, handle(ctx, h, nil, schemas.VerbPermit, nil, h.Permit)},
		{schemas.VerbDescribe, handle(ctx, h, nil, schemas.VerbDescribe, nil, func(context.Context, struct{}) (schemas.NodeRecord, error) { return h.ads.record(), nil })},
	}
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

// handle adapts an operation to a micro handler: strict JSON decoding,
// replies with the result or {"error":{"code","message"}} (with the micro
// service-error headers), and, for state-changing verbs, the first reply
// to every retry of a request id.
func handle[Req, Rep any](ctx context.Context, h *Host, d *dedupe, verb schemas.Verb, requestID func(Req) string, op func(context.Context, Req) (Rep, error)) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		var req Req
		if err := decodeStrict(r.Data(), &req); err != nil {
			h.answer(verb, r, reply(nil, schemas.Errf(schemas.CodeInvalid, "invalid %s request: %v", verb, err)), true)
			return
		}
		h.serveRequest(verb, r, func(notice func()) answer {
			do := func() (answer, bool) {
				rctx, cancel := context.WithTimeout(client.WithWaitNotice(ctx, notice), h.verbDeadline(verb, req))
				defer cancel()
				rep, err := op(rctx, req)
				code := schemas.CodeOf(err)
				// A failure that may pass (a node busy or away, a
				// timeout) is not kept: a retry tries again.
				return reply(rep, err), code != schemas.CodeUnavailable && code != schemas.CodeTimeout
			}
			if d != nil && requestID != nil && requestID(req) != "" {
				return d.do(string(verb)+"/"+requestID(req), notice, do)
			}
			a, _ := do()
			return a
		})
	})
}

// serveRequest answers r with what work returns. work runs on a goroutine
// of its own; the handler holds r until work answers, or announces a long
// wait with notice (client.WithWaitNotice). What is answered while r is
// held counts in `nats micro stats`, errors included; r is let go before
// a long wait, so the endpoint's next request is not held up behind it.
func (h *Host) serveRequest(verb schemas.Verb, r micro.Request, work func(notice func()) answer) {
	client.Hold(h.requests.Go, work, func(a answer, held bool) { h.answer(verb, r, a, held) })
}

// answer is a control reply: its body and, for a failure, its error.
type answer struct {
	body []byte
	err  *schemas.ControlError
}

// answer sends a to r. A failure carries the micro service-error headers
// as well as its JSON body; held says the handler still holds r, so micro
// counts it (a reply sent later must not touch micro's count: it would
// race with the handler's return).
func (h *Host) answer(verb schemas.Verb, r micro.Request, a answer, held bool) {
	if a.err == nil {
		r.Respond(a.body)
		return
	}
	h.cfg.Metrics.RequestFailed(verb, a.err.Code)
	code, desc := strconv.Itoa(a.err.Code.ServiceCode()), a.err.ServiceDescription()
	if held {
		r.Error(code, desc, a.body)
		return
	}
	r.Respond(a.body, micro.WithHeaders(micro.Headers{micro.ErrorHeader: {desc}, micro.ErrorCodeHeader: {code}}))
}

// verbDeadline bounds a request of verb: a run waits its own timeout, an
// open a little longer than the node waits for its agent to start, the
// rest briefly.
func (h *Host) verbDeadline(verb schemas.Verb, req any) time.Duration {
	switch verb {
	case schemas.VerbRun:
		timeout := schemas.DefaultRunTimeout
		if r, ok := req.(schemas.RunRequest); ok {
			if t, err := schemas.RunTimeout(r.Timeout); err == nil {
				timeout = t
			}
		}
		return timeout + 30*time.Second
	case schemas.VerbOpen:
		return h.cfg.OpenTimeout + 10*time.Second
	case schemas.VerbClose, schemas.VerbSetModel:
		return time.Minute
	}
	return 30 * time.Second
}

func decodeStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func reply(rep any, err error) answer {
	if err != nil {
		ce, ok := errors.AsType[*schemas.ControlError](err)
		if !ok {
			ce = &schemas.ControlError{Code: schemas.CodeInternal, Message: err.Error()}
		}
		b, _ := json.Marshal(schemas.ErrorReply{Error: ce})
		return answer{body: b, err: ce}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		ce := schemas.Errf(schemas.CodeInternal, "encode the reply: %v", err)
		b, _ = json.Marshal(schemas.ErrorReply{Error: ce})
		return answer{body: b, err: ce}
	}
	return answer{body: b}
}

// dedupe answers every retry of a request id with the first reply, and
// makes a retry that arrives while the first is still running wait for it,
// so a retried request never acts twice.
type dedupe struct {
	window time.Duration

	mu      sync.Mutex
	entries map[string]*dedupeEntry
}

type dedupeEntry struct {
	done  chan struct{}
	reply answer
	at    time.Time
	set   bool
}

func newDedupe(window time.Duration) *dedupe {
	return &dedupe{window: window, entries: map[string]*dedupeEntry{}}
}

// do runs fn for the first request of key, and answers the others with its
// reply; a retry that has to wait for the first announces it with notice.
func (d *dedupe) do(key string, notice func(), fn func() (reply answer, keep bool)) answer {
	d.mu.Lock()
	now := time.Now()
	for k, e := range d.entries {
		if e.set && now.Sub(e.at) > d.window {
			delete(d.entries, k)
		}
	}
	if e, ok := d.entries[key]; ok {
		d.mu.Unlock()
		select {
		case <-e.done:
		default:
			notice()
			<-e.done
		}
		return e.reply
	}
	e := &dedupeEntry{done: make(chan struct{})}
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
