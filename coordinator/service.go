package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Service is the coordinator's NATS micro service, shoal-fabric
// (schemas.FabricService): the whole fabric behind one door, for clients
// whose credentials reach neither the nodes nor the stream. It answers
// every verb of client.Client under shoal.fabric.<verb> by running it
// with the coordinator's direct client, and streams replays.
//
// Replies go only to _INBOX subjects: a reply is published with the
// coordinator's rights, and a requester may name any reply subject.
type Service struct {
	cfg   ServiceConfig
	ready chan struct{}
}

// ServiceConfig configures the fabric service.
type ServiceConfig struct {
	// Conn is a connection with the coordinator's rights.
	Conn *nats.Conn
	// Client is the coordinator's own client, which does the work.
	Client *client.Direct
	// Version is reported to `nats micro info`.
	Version string
	// Metrics counts the service's error replies; nil counts nothing.
	Metrics ServiceMetrics
}

// ServiceMetrics receives what the fabric service counts. Its methods are
// called from many goroutines and must not block.
type ServiceMetrics interface {
	// RequestFailed counts an error reply to a request of verb.
	RequestFailed(verb string, code schemas.ErrorCode)
}

type noServiceMetrics struct{}

func (noServiceMetrics) RequestFailed(string, schemas.ErrorCode) {}

// NewService checks cfg.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Conn == nil || cfg.Client == nil {
		return nil, errors.New("the fabric service needs a connection and a client")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noServiceMetrics{}
	}
	return &Service{cfg: cfg, ready: make(chan struct{})}, nil
}

// Ready is closed once the service answers.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	nc, f := s.cfg.Conn, s.cfg.Client
	svc, err := micro.AddService(nc, micro.Config{
		Name: schemas.FabricService, Version: s.cfg.Version,
		Description: "Shoal coordinator: placement, control, replay",
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", schemas.FabricService, err)
	}
	g := svc.AddGroup("shoal.fabric")
	agent := func(op func(context.Context, string) (any, error)) func(context.Context, schemas.AgentRequest) (any, error) {
		return func(ctx context.Context, r schemas.AgentRequest) (any, error) { return op(ctx, r.AgentID) }
	}
	endpoints := map[string]func(verb string) micro.Handler{
		"events":    serveJSON(ctx, s, f.Events),
		"open":      serveJSON(ctx, s, f.Open),
		"send":      serveJSON(ctx, s, f.Send),
		"run":       serveJSON(ctx, s, f.Run),
		"output":    serveJSON(ctx, s, f.Output),
		"set_model": serveJSON(ctx, s, f.SetModel),
		"permit":    serveJSON(ctx, s, f.Permit),
		"pending": serveJSON(ctx, s, func(ctx context.Context, _ struct{}) (schemas.PendingReply, error) {
			reqs, err := f.Pending(ctx)
			return schemas.PendingReply{Requests: reqs}, err
		}),
		"status":    serveJSON(ctx, s, agent(func(ctx context.Context, id string) (any, error) { return f.Status(ctx, id) })),
		"record":    serveJSON(ctx, s, agent(func(ctx context.Context, id string) (any, error) { return f.Record(ctx, id) })),
		"interrupt": serveJSON(ctx, s, f.Interrupt),
		"close":     serveJSON(ctx, s, f.Close),
		"list": serveJSON(ctx, s, func(ctx context.Context, _ schemas.ListRequest) (schemas.ListReply, error) {
			recs, err := f.List(ctx)
			return schemas.ListReply{Agents: recs}, err
		}),
		"nodes": serveJSON(ctx, s, func(ctx context.Context, _ struct{}) (schemas.NodesReply, error) {
			nodes, err := f.Nodes(ctx)
			return schemas.NodesReply{Nodes: nodes}, err
		}),
		"replay": func(string) micro.Handler {
			return micro.HandlerFunc(func(r micro.Request) {
				if !toInbox(r) {
					return
				}
				go serveReplay(ctx, nc, f, r)
			})
		},
	}
	for name, h := range endpoints {
		if err := g.AddEndpoint(name, h(name)); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	close(s.ready)
	<-ctx.Done()
	return svc.Stop()
}

// toInbox reports whether a request's reply subject is an inbox, the only
// kind of subject the coordinator answers on.
func toInbox(r micro.Request) bool {
	return strings.HasPrefix(r.Reply(), "_INBOX.")
}

// serveJSON adapts an operation to the handler of verb: JSON requests,
// replies with the result or {"error":{"code","message"}} (with the micro
// service-error headers).
func serveJSON[Req, Rep any](ctx context.Context, s *Service, op func(context.Context, Req) (Rep, error)) func(verb string) micro.Handler {
	return func(verb string) micro.Handler {
		return micro.HandlerFunc(func(r micro.Request) {
			if !toInbox(r) {
				return
			}
			var req Req
			if err := json.Unmarshal(r.Data(), &req); err != nil {
				s.answer(verb, r, encodeReply(nil, schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err)), true)
				return
			}
			s.serveRequest(verb, r, func(notice func()) answer {
				rep, err := op(client.WithWaitNotice(ctx, notice), req)
				return encodeReply(rep, err)
			})
		})
	}
}

// serveRequest answers r with what work returns. work runs on a goroutine
// of its own; the handler holds r until work answers, or announces a long
// wait with notice (client.WithWaitNotice). What is answered while r is
// held counts in `nats micro stats`, errors included; r is let go before
// a long wait (a run, an open), so the endpoint's next request is not held
// up behind it.
func (s *Service) serveRequest(verb string, r micro.Request, work func(notice func()) answer) {
	client.Hold(func(f func()) { go f() }, work, func(a answer, held bool) { s.answer(verb, r, a, held) })
}

// answer is a reply of the fabric service: its body and, for a failure,
// its error.
type answer struct {
	body []byte
	err  *schemas.ControlError
}

// encodeReply is rep as a reply body, or err as {"error":{"code","message"}}.
func encodeReply(rep any, err error) answer {
	if err != nil {
		ce, ok := errors.AsType[*schemas.ControlError](err)
		if !ok {
			ce = schemas.Errf(schemas.CodeInternal, "%v", err)
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

// answer sends a to r. A failure carries the micro service-error headers
// as well as its JSON body; held says the handler still holds r, so micro
// counts it (a reply sent later must not touch micro's count: it would
// race with the handler's return).
func (s *Service) answer(verb string, r micro.Request, a answer, held bool) {
	if a.err == nil {
		r.Respond(a.body)
		return
	}
	s.cfg.Metrics.RequestFailed(verb, a.err.Code)
	code, desc := strconv.Itoa(a.err.Code.ServiceCode()), a.err.ServiceDescription()
	if held {
		r.Error(code, desc, a.body)
		return
	}
	r.Respond(a.body, micro.WithHeaders(serviceErrorHeaders(a.err)))
}

// serviceErrorHeaders are the micro service-error headers of ce.
func serviceErrorHeaders(ce *schemas.ControlError) micro.Headers {
	return micro.Headers{
		micro.ErrorHeader:     {ce.ServiceDescription()},
		micro.ErrorCodeHeader: {strconv.Itoa(ce.Code.ServiceCode())},
	}
}

// serveReplay streams a replay to the reply subject of r: each event with
// its headers, the gaps, acknowledgement requests for flow control, and
// an end or an error.
func serveReplay(ctx context.Context, nc *nats.Conn, f *client.Direct, r micro.Request) {
	to := r.Reply()
	send := func(m *nats.Msg) error {
		m.Subject = to
		return nc.PublishMsg(m)
	}
	control := func(kind string, body []byte) *nats.Msg {
		m := nats.NewMsg(to)
		m.Header.Set(schemas.HeaderReplay, kind)
		m.Data = body
		return m
	}
	fail := func(err error) {
		ce, ok := errors.AsType[*schemas.ControlError](err)
		if !ok {
			ce = schemas.Errf(schemas.CodeInternal, "%v", err)
		}
		body, _ := json.Marshal(schemas.ErrorReply{Error: ce})
		m := control("error", body)
		for k, v := range serviceErrorHeaders(ce) {
			m.Header[k] = v
		}
		send(m)
	}
	var req schemas.ReplayRequest
	if err := json.Unmarshal(r.Data(), &req); err != nil {
		fail(schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err))
		return
	}
	from, err := replayFrom(req)
	if err != nil {
		fail(err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// ack asks the client to answer; a client that does not is gone.
	ack := func() error {
		actx, acancel := context.WithTimeout(ctx, schemas.ReplayAckWait)
		defer acancel()
		_, err := nc.RequestMsgWithContext(actx, control("ack", nil))
		if err != nil {
			cancel()
		}
		return err
	}
	// While the replay waits for live events, the client still hears from
	// it, and a client that went away is noticed.
	heard := make(chan struct{}, 1)
	go func() {
		t := time.NewTicker(schemas.ReplayIdle)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-heard:
				t.Reset(schemas.ReplayIdle)
			case <-t.C:
				if ack() != nil {
					return
				}
			}
		}
	}()
	sent := 0
	err = f.Replay(ctx, req.Agents, from, req.Follow, func(ev client.Replayed, gap *client.Gap) error {
		m := nats.NewMsg(to)
		m.Data = ev.Raw
		if ev.Stray != "" {
			m.Header.Set(schemas.HeaderStray, ev.Stray)
			m.Header.Set(schemas.HeaderAgent, ev.Agent)
			m.Header.Set(schemas.HeaderSeq, strconv.FormatUint(ev.Seq, 10))
			if ev.N > 0 {
				m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(ev.Agent, ev.N))
			}
			return send(m)
		}
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(ev.Agent, ev.N))
		m.Header.Set(schemas.HeaderNode, ev.Node)
		m.Header.Set(schemas.HeaderSeq, strconv.FormatUint(ev.Seq, 10))
		m.Header.Set(schemas.HeaderStored, ev.Time.UTC().Format(time.RFC3339Nano))
		if gap != nil {
			m.Header.Set(schemas.HeaderGap, fmt.Sprintf("%d-%d", gap.From, gap.To))
		}
		if err := send(m); err != nil {
			return err
		}
		select {
		case heard <- struct{}{}:
		default:
		}
		if sent++; sent%schemas.ReplayAckEvery == 0 {
			return ack()
		}
		return nil
	})
	switch {
	case ctx.Err() != nil:
		// The client went away, or the coordinator is stopping.
	case err != nil:
		fail(err)
	default:
		send(control("end", nil))
	}
}

// replayFrom reads where a streamed replay starts.
func replayFrom(req schemas.ReplayRequest) (client.From, error) {
	var from client.From
	set := 0
	if req.FromEvent > 0 {
		from.Event, set = req.FromEvent, set+1
	}
	if req.FromTurn < 0 {
		return from, schemas.Errf(schemas.CodeInvalid, "from_turn must be positive")
	}
	if req.FromTurn > 0 {
		from.Turn, set = req.FromTurn, set+1
	}
	if req.Since != "" {
		t, err := time.Parse(time.RFC3339Nano, req.Since)
		if err != nil {
			return from, schemas.Errf(schemas.CodeInvalid, "since %q is not an RFC 3339 time (e.g. 2026-11-29T10:00:00Z)", req.Since)
		}
		from.Time, set = t, set+1
	}
	if req.New {
		from.New, set = true, set+1
	}
	if set > 1 {
		return from, schemas.Errf(schemas.CodeInvalid, "give at most one of from_event, from_turn, since and new")
	}
	return from, nil
}
