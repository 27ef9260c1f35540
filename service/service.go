// Package service is the request adapter of Shoal's NATS micro services,
// the node's (shoal-node) and the coordinator's (shoal-fabric): every
// request checked against its schema before anything is built from it and
// decoded strictly, run on a goroutine the service owns (Server.Wait waits
// for them all) within its verb's deadline, and answered with its result
// or {"error":{"code","message"}} and the micro service-error headers.
//
// It also holds the wait notice by which an operation tells the adapter
// it starts a long wait (LongWait), so that a request which fails at once
// is answered while micro still counts it, and a long one lets the
// endpoint take the next request.
package service

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
)

// Reply is a control reply: its body and, for a failure, its error.
type Reply struct {
	Body []byte
	Err  *schemas.ControlError
}

// Encode is rep as a reply, or err as {"error":{"code","message"}}; an
// error that is no ControlError is internal.
func Encode(rep any, err error) Reply {
	if err != nil {
		ce, ok := errors.AsType[*schemas.ControlError](err)
		if !ok {
			ce = schemas.Errf(schemas.CodeInternal, "%v", err)
		}
		b, _ := json.Marshal(schemas.ErrorReply{Error: ce})
		return Reply{Body: b, Err: ce}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		ce := schemas.Errf(schemas.CodeInternal, "encode the reply: %v", err)
		b, _ = json.Marshal(schemas.ErrorReply{Error: ce})
		return Reply{Body: b, Err: ce}
	}
	return Reply{Body: b}
}

// Metrics receives what a service counts. Its methods are called from
// many goroutines and must not block.
type Metrics interface {
	// RequestFailed counts an error reply to a request of verb.
	RequestFailed(verb schemas.Verb, code schemas.ErrorCode)
}

type noMetrics struct{}

func (noMetrics) RequestFailed(schemas.Verb, schemas.ErrorCode) {}

// Server runs the requests of one service. Its zero value is not usable:
// make one with NewServer.
type Server struct {
	ctx      context.Context
	metrics  Metrics
	maxReply int
	work     sync.WaitGroup
	nc       *nats.Conn // where it says it still holds a request; none when nil
	maxHeld  int64      // the requests it runs at once; no bound when 0
	who      string     // what it is, for the words of its bound
	held     atomic.Int64
}

// NewServer returns a server whose requests live within ctx; metrics may
// be nil. maxReply is the most a reply may hold (the connection's
// MaxPayload; 0 for no bound): a larger one is answered with an error
// saying so, where it would otherwise be lost and its caller left to wait.
func NewServer(ctx context.Context, metrics Metrics, maxReply int64) *Server {
	if metrics == nil {
		metrics = noMetrics{}
	}
	return &Server{ctx: ctx, metrics: metrics, maxReply: int(maxReply)}
}

// KeepAlive lets the server say, on nc, that it still holds a request
// whose caller asks (schemas.HeaderKeepalive): a caller whose connection
// stays up learns so that the process which took its request is gone.
func (s *Server) KeepAlive(nc *nats.Conn) { s.nc = nc }

// Bound makes the server run at most n requests at once (each a goroutine
// or two and a few KB while it waits on a node, a turn, a reader): one
// more is answered at once, unavailable, saying so (who it is: "the
// coordinator"). No bound when n is 0.
func (s *Server) Bound(n int, who string) { s.maxHeld, s.who = int64(n), who }

// take counts a request under way, or reports that the bound is reached.
func (s *Server) take() bool {
	if s.held.Add(1) > s.maxHeld && s.maxHeld > 0 {
		s.held.Add(-1)
		return false
	}
	return true
}

// keepalive says, every interval the request asks for (within
// [minKeepalive, maxKeepalive]), that r is still held, until the returned
// stop is called; only to an inbox (a reply subject may name any subject,
// and the service publishes with its own rights).
func (s *Server) keepalive(r micro.Request) (stop func()) {
	ms, err := strconv.Atoi(r.Headers().Get(schemas.HeaderKeepalive))
	if s.nc == nil || err != nil || ms <= 0 || !IsInbox(r.Reply()) {
		return func() {}
	}
	every := min(max(time.Duration(ms)*time.Millisecond, minKeepalive), maxKeepalive)
	done := make(chan struct{})
	var once sync.Once
	say := func() {
		m := nats.NewMsg(r.Reply())
		m.Header.Set(schemas.HeaderKeepalive, "1")
		s.nc.PublishMsg(m)
	}
	// The first word at once: a caller whose request was taken by a
	// process that dies within the interval learns of it too.
	say()
	s.work.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-s.ctx.Done():
				return
			case <-t.C:
				say()
			}
		}
	})
	return func() { once.Do(func() { close(done) }) }
}

// The bounds of a keepalive's interval.
const (
	minKeepalive = time.Second
	maxKeepalive = time.Minute
)

// Wait waits for every request the server has started to be answered.
func (s *Server) Wait() { s.work.Wait() }

// Go runs fn on a goroutine the server waits for.
func (s *Server) Go(fn func()) { s.work.Go(fn) }

// DefaultDeadline bounds a request whose endpoint names none.
const DefaultDeadline = 30 * time.Second

// Endpoint is one verb of a service.
type Endpoint[Req any] struct {
	Verb schemas.Verb
	// Schema is what a request must be; its problems are answered as
	// invalid, in Kaimon's words, before Handle runs.
	Schema *validate.Request
	// Deadline bounds the request; DefaultDeadline when nil.
	Deadline func(Req) time.Duration
	// Allow, when given, may refuse a decoded request before it runs (the
	// rights rules, say).
	Allow func(Req) error
	// Handle answers the request; body is its bytes as received.
	Handle func(ctx context.Context, req Req, body []byte) Reply
	// InboxOnly drops requests whose reply subject is no inbox, unanswered:
	// a reply is published with the service's rights, and a requester may
	// name any reply subject.
	InboxOnly bool
}

// Op adapts an operation to Endpoint.Handle.
func Op[Req, Rep any](op func(context.Context, Req) (Rep, error)) func(context.Context, Req, []byte) Reply {
	return func(ctx context.Context, req Req, _ []byte) Reply {
		rep, err := op(ctx, req)
		return Encode(rep, err)
	}
}

// Handler is e as a micro handler on s.
func Handler[Req any](s *Server, e Endpoint[Req]) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		if !Answerable(r.Reply()) || (e.InboxOnly && !IsInbox(r.Reply())) {
			return
		}
		var req Req
		if err := e.Schema.Decode(r.Data(), &req); err != nil {
			s.answer(e.Verb, r, Encode(nil, schemas.Errf(schemas.CodeInvalid, "invalid %s request: %v", e.Verb, err)), true)
			return
		}
		if e.Allow != nil {
			if err := e.Allow(req); err != nil {
				s.answer(e.Verb, r, Encode(nil, err), true)
				return
			}
		}
		deadline := DefaultDeadline
		if e.Deadline != nil {
			deadline = e.Deadline(req)
		}
		if !s.take() {
			s.answer(e.Verb, r, Encode(nil, schemas.Errf(schemas.CodeUnavailable, "%s has %d requests under way, the most it runs at once: try again once some are answered", s.who, s.maxHeld)), true)
			return
		}
		body := r.Data()
		stop := s.keepalive(r)
		hold(s.Go, func(notice func()) Reply {
			ctx, cancel := context.WithTimeout(WithWaitNotice(s.ctx, notice), deadline)
			defer cancel()
			return e.Handle(ctx, req, body)
		}, func(a Reply, held bool) {
			stop()
			s.held.Add(-1)
			s.answer(e.Verb, r, a, held)
		})
	})
}

// IsInbox reports whether a reply subject is an inbox.
func IsInbox(subject string) bool {
	return len(subject) > len("_INBOX.") && subject[:len("_INBOX.")] == "_INBOX."
}

// Answerable reports whether a request's reply subject may be answered:
// set, and no longer than schemas.MaxReplySubject.
func Answerable(reply string) bool {
	return reply != "" && len(reply) <= schemas.MaxReplySubject
}

// answer sends a to r. A failure carries the micro service-error headers
// as well as its JSON body; held says the handler still holds r, so micro
// counts it (a reply sent later must not touch micro's count: it would
// race with the handler's return).
func (s *Server) answer(verb schemas.Verb, r micro.Request, a Reply, held bool) {
	if s.maxReply > 0 && len(a.Body) > s.maxReply {
		a = Encode(nil, schemas.Errf(schemas.CodeInternal, "the %s reply is %d bytes, more than a message of this fabric holds (%d bytes, the NATS server's max_payload): ask for less, or raise the server's limit", verb, len(a.Body), s.maxReply))
	}
	if a.Err == nil {
		r.Respond(a.Body)
		return
	}
	s.metrics.RequestFailed(verb, a.Err.Code)
	if held {
		r.Error(strconv.Itoa(a.Err.Code.ServiceCode()), a.Err.ServiceDescription(), a.Body)
		return
	}
	r.Respond(a.Body, micro.WithHeaders(ErrorHeaders(a.Err)))
}

// ErrorHeaders are the micro service-error headers of ce.
func ErrorHeaders(ce *schemas.ControlError) micro.Headers {
	return micro.Headers{
		micro.ErrorHeader:     {ce.ServiceDescription()},
		micro.ErrorCodeHeader: {strconv.Itoa(ce.Code.ServiceCode())},
	}
}
