package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
	"github.com/shoalfabric/shoal/service"
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
	// MaxHeld bounds the requests it runs at once, all callers together
	// (a caller is known only by a reply subject it may name freely);
	// DefaultMaxHeld when 0.
	MaxHeld int
}

// DefaultMaxHeld is how many requests the fabric service runs at once:
// each costs a few KB and a goroutine or two while it waits on a node, a
// turn or a reader, and a caller holding sends for a node that answers
// nothing could otherwise take the coordinator's memory, 2,000 at a time.
// A thousand agents each with a run and a send waiting take half.
const DefaultMaxHeld = 4096

// ServiceMetrics receives what the fabric service counts: its error
// replies by verb and code.
type ServiceMetrics = service.Metrics

// NewService checks cfg.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Conn == nil || cfg.Client == nil {
		return nil, errors.New("the fabric service needs a connection and a client")
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
	g := svc.AddGroup(schemas.FabricPrefix)
	srv := service.NewServer(ctx, s.cfg.Metrics, nc.MaxPayload())
	srv.KeepAlive(nc)
	maxHeld := s.cfg.MaxHeld
	if maxHeld == 0 {
		maxHeld = DefaultMaxHeld
	}
	srv.Bound(maxHeld, "the coordinator")
	defer srv.Wait()
	defer svc.Stop()
	reads := &readers{under: map[string]int{}}
	agent := func(op func(context.Context, string) (any, error)) func(context.Context, schemas.AgentRequest) (any, error) {
		return func(ctx context.Context, r schemas.AgentRequest) (any, error) { return op(ctx, r.AgentID) }
	}
	endpoints := map[schemas.Verb]micro.Handler{
		schemas.VerbEvents:   reads.bound(serve(srv, schemas.VerbEvents, "events_request", f.Events)),
		schemas.VerbOpen:     serve(srv, schemas.VerbOpen, "open_request", f.Open),
		schemas.VerbSend:     serve(srv, schemas.VerbSend, "send_request", f.Send),
		schemas.VerbRun:      serve(srv, schemas.VerbRun, "run_request", f.Run),
		schemas.VerbOutput:   reads.bound(serve(srv, schemas.VerbOutput, "output_request", f.Output)),
		schemas.VerbSetModel: serve(srv, schemas.VerbSetModel, "set_model_request", f.SetModel),
		schemas.VerbPermit: serve(srv, schemas.VerbPermit, "permit_request", func(ctx context.Context, r schemas.PermitRequest) (schemas.PermitReply, error) {
			r.By = "a client of the fabric service" // the service sets it: a request may not
			return f.Permit(ctx, r)
		}),
		schemas.VerbInterrupt: serve(srv, schemas.VerbInterrupt, "agent_request", f.Interrupt),
		schemas.VerbClose:     serve(srv, schemas.VerbClose, "agent_request", f.Close),
		schemas.VerbPending: serve(srv, schemas.VerbPending, "pending_request", func(ctx context.Context, _ struct{}) (schemas.PendingReply, error) {
			all, err := f.Pending(ctx)
			if err != nil {
				return schemas.PendingReply{}, err
			}
			// One reply: within the payload limit, with room to spare.
			rep := schemas.PendingWithin(all.Requests, int(nc.MaxPayload())/2)
			rep.Omitted += all.Omitted
			return rep, nil
		}),
		schemas.VerbStatus: reads.bound(serve(srv, schemas.VerbStatus, "status_request", agent(func(ctx context.Context, id string) (any, error) { return f.Status(ctx, id) }))),
		schemas.VerbRecord: serve(srv, schemas.VerbRecord, "status_request", agent(func(ctx context.Context, id string) (any, error) { return f.Record(ctx, id) })),
		schemas.VerbList: serve(srv, schemas.VerbList, "fabric_list_request", func(ctx context.Context, r schemas.FabricListRequest) (schemas.ListReply, error) {
			recs, err := f.List(ctx)
			if err != nil {
				return schemas.ListReply{}, err
			}
			if !r.Paged {
				// Whole, as a client of an earlier version asks for it.
				return schemas.ListReply{Agents: recs}, nil
			}
			// In pages, each within the payload limit, with room to spare.
			return schemas.ListPage(recs, r.After, int(nc.MaxPayload())/2), nil
		}),
		schemas.VerbNodes: serve(srv, schemas.VerbNodes, "fabric_nodes_request", func(ctx context.Context, r schemas.FabricNodesRequest) (schemas.NodesReply, error) {
			nodes, err := f.Nodes(ctx)
			if err != nil || !r.Paged {
				// Whole, as a client of an earlier version asks for it.
				return schemas.NodesReply{Nodes: nodes}, err
			}
			// In pages: a node's record may be 64 KiB.
			return schemas.NodesPage(nodes, r.After, int(nc.MaxPayload())/2), nil
		}),
		schemas.VerbBudget: serve(srv, schemas.VerbBudget, "budget_request", func(ctx context.Context, r schemas.BudgetRequest) (struct{}, error) {
			return struct{}{}, f.SetBudget(ctx, r)
		}),
		schemas.VerbBudgets: serve(srv, schemas.VerbBudgets, "budgets_request", func(ctx context.Context, r schemas.BudgetsRequest) (schemas.BudgetsReply, error) {
			all, err := f.Budgets(ctx)
			if err != nil || !r.Paged {
				// Whole, as a client of an earlier version asks for it.
				return all, err
			}
			return schemas.BudgetsPage(all, r.After, int(nc.MaxPayload())/2), nil
		}),
		schemas.VerbDiff: serve(srv, schemas.VerbDiff, "diff_request", func(ctx context.Context, r schemas.DiffRequest) (schemas.DiffReply, error) {
			return f.Diff(ctx, r.AgentID, r.Stat)
		}),
		schemas.VerbReplay: micro.HandlerFunc(func(r micro.Request) {
			if !service.IsInbox(r.Reply()) || !service.Answerable(r.Reply()) {
				return
			}
			// Read here, a request at a time, before anything is held
			// for it.
			req, from, err := replayRequest(r.Data())
			if err != nil {
				replayFailed(nc, r.Reply(), err)
				return
			}
			greeted, err := reads.greet(r.Reply())
			if err != nil {
				replayFailed(nc, r.Reply(), err)
				return
			}
			to := r.Reply()
			srv.Go(func() { serveReplay(ctx, nc, f, to, req, from, reads, greeted) })
		}),
	}
	if len(endpoints) != len(schemas.FabricVerbs) {
		return fmt.Errorf("the fabric service serves %d verbs, the contract names %d", len(endpoints), len(schemas.FabricVerbs))
	}
	for verb, h := range endpoints {
		if err := g.AddEndpoint(string(verb), h); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	close(s.ready)
	<-ctx.Done()
	return nil
}

// The fabric service's reads each hold a reader of the agents' stream (a
// JetStream consumer) while they last, and the stream has at most 1,000
// for everyone: an observer's credentials following a thousand replays
// took every reader of the fabric. A followed replay lasts as long as
// its reader answers, so replays are bounded per caller; a caller is
// known by the inbox namespace of the replay's reply subject
// (_INBOX.<role>-<name> under --auth, the only one its credentials may
// subscribe to), proven before any reader is made: the reply subject's
// subscriber must answer a first flow-control request, sent there with a
// reply subject nobody can guess. Anyone may name any reply subject; only
// the inbox's own subscriber hears the request. Event pages and output
// reads last a moment each, and are bounded in all.
const (
	// readersPerCaller bounds the replays one caller has under way.
	readersPerCaller = 64
	// readersInAll bounds the replays of every caller together.
	readersInAll = 512
	// greetingsPerCaller and greetingsInAll bound the replays waiting for
	// their reader's first answer (each a goroutine, and nothing else, for
	// at most greetingWait), by the caller the reply subject names and in
	// all: a caller that subscribes to its inbox and never answers holds
	// its own. One naming another's inbox holds nothing: nobody answers
	// there, and the server says so at once.
	greetingsPerCaller = 64
	greetingsInAll     = 1024
	greetingWait       = 5 * time.Second
	// shortReadsInAll bounds the event pages, output reads and statuses
	// (a status of an agent no longer kept is read from the stream) under
	// way, in all: a caller is known by a reply subject it may name freely,
	// so a bound per caller would only let one lock out another.
	shortReadsInAll = 128
	// replayAnswersHeld bounds the messages (and KiB) a replay's
	// flow-control subscription holds unread.
	replayAnswersHeld = 64
)

// readers counts the fabric service's reads under way.
type readers struct {
	mu       sync.Mutex
	under    map[string]int // replays by caller
	greeters map[string]int // replays waiting for their first answer, by caller
	replays  int
	greeting int
	short    int
}

// callerOf is the inbox namespace of reply.
func callerOf(reply string) string {
	rest := strings.TrimPrefix(reply, "_INBOX.")
	who, _, _ := strings.Cut(rest, ".")
	return who
}

// greet counts a replay waiting for its reader's first answer, or says
// why none may wait now; done is called once the answer came or did not.
func (rs *readers) greet(reply string) (done func(), err error) {
	who := callerOf(reply)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch n := rs.greeters[who]; {
	case n >= greetingsPerCaller:
		return nil, schemas.Errf(schemas.CodeUnavailable, "%d replays under these credentials are waiting for their first answer, the most they may: answer them", n)
	case rs.greeting >= greetingsInAll:
		return nil, schemas.Errf(schemas.CodeUnavailable, "%d replays are waiting for their readers' first answer, the most the coordinator waits for: try again", rs.greeting)
	}
	if rs.greeters == nil {
		rs.greeters = map[string]int{}
	}
	rs.greeters[who]++
	rs.greeting++
	var once sync.Once
	return func() {
		once.Do(func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			rs.greeting--
			if rs.greeters[who]--; rs.greeters[who] <= 0 {
				delete(rs.greeters, who)
			}
		})
	}, nil
}

// begin counts a replay answered at reply, whose reader has answered, or
// says why it may not begin now; end is called once it is over.
func (rs *readers) begin(reply string) (end func(), err error) {
	who := callerOf(reply)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch n := rs.under[who]; {
	case n >= readersPerCaller:
		return nil, schemas.Errf(schemas.CodeUnavailable, "%d replays under these credentials are under way, the most they may have at once: end one (a followed replay ends when its reader stops)", n)
	case rs.replays >= readersInAll:
		return nil, schemas.Errf(schemas.CodeUnavailable, "%d replays are under way, the most the coordinator serves at once: try again", rs.replays)
	}
	rs.under[who]++
	rs.replays++
	return func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		rs.replays--
		if rs.under[who]--; rs.under[who] <= 0 {
			delete(rs.under, who)
		}
	}, nil
}

// bound holds h's requests (event pages, output reads) to the bound of
// short reads in all: past it, a request is answered unavailable.
func (rs *readers) bound(h micro.Handler) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		if !service.IsInbox(r.Reply()) || !service.Answerable(r.Reply()) {
			return
		}
		rs.mu.Lock()
		n := rs.short
		if n < shortReadsInAll {
			rs.short++
		}
		rs.mu.Unlock()
		if n >= shortReadsInAll {
			ce := schemas.Errf(schemas.CodeUnavailable, "%d reads of the stream are under way, the most the coordinator serves at once: try again", n)
			body, _ := json.Marshal(schemas.ErrorReply{Error: ce})
			r.Error(strconv.Itoa(ce.Code.ServiceCode()), ce.ServiceDescription(), body)
			return
		}
		// The handler answers on a goroutine of its own; the read is over
		// once the answer is sent.
		h.Handle(&answered{Request: r, end: func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			rs.short--
		}})
	})
}

// answered is a request whose end is called once it is answered.
type answered struct {
	micro.Request
	once sync.Once
	end  func()
}

func (a *answered) Respond(data []byte, opts ...micro.RespondOpt) error {
	defer a.once.Do(a.end)
	return a.Request.Respond(data, opts...)
}

func (a *answered) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	defer a.once.Do(a.end)
	return a.Request.Error(code, description, data, opts...)
}

// replayFailed answers a replay request at to with err, as its stream's
// error.
func replayFailed(nc *nats.Conn, to string, err error) {
	ce, ok := errors.AsType[*schemas.ControlError](err)
	if !ok {
		ce = schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	body, _ := json.Marshal(schemas.ErrorReply{Error: ce})
	m := nats.NewMsg(to)
	m.Header.Set(schemas.HeaderReplay, "error")
	m.Data = body
	for k, v := range service.ErrorHeaders(ce) {
		m.Header[k] = v
	}
	nc.PublishMsg(m)
}

// serveReplay streams a replay to the reply subject of r: each event with
// its headers, the gaps, acknowledgement requests for flow control, and
// an end or an error.
func serveReplay(ctx context.Context, nc *nats.Conn, f *client.Direct, to string, req schemas.ReplayRequest, from client.From, reads *readers, greeted func()) {
	defer greeted()
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
	fail := func(err error) { replayFailed(nc, to, err) }
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// ack asks the client to answer; a client that does not is gone. The
	// answer comes to a subject under schemas.ReplayAckPrefix, the one
	// reply a client's credentials may publish: they may answer nothing
	// else they receive (a publish's acknowledgement, say).
	answers := schemas.ReplayAckPrefix + "." + rand.Text() // nobody may guess it
	// An answer is one small message for each ask; a reader sending more
	// (it knows the subjects) loses its replay, not the coordinator's
	// memory. The answers wait in a channel of a few: a sync subscription's
	// is 65,536 long (512 KiB a replay, for every replay under way).
	answered := make(chan *nats.Msg, replayAnswersHeld)
	heardBack, err := nc.Subscribe(answers+".*", func(m *nats.Msg) {
		select {
		case answered <- m:
		default:
			cancel() // more than it was asked for
		}
	})
	if err != nil {
		fail(schemas.Errf(schemas.CodeUnavailable, "the replay's flow control: %v", err))
		return
	}
	defer heardBack.Unsubscribe()
	heardBack.SetPendingLimits(replayAnswersHeld, replayAnswersHeld<<10)
	var asking sync.Mutex
	asked := 0
	ackWithin := func(wait time.Duration) error {
		asking.Lock()
		defer asking.Unlock()
		asked++
		want := answers + "." + strconv.Itoa(asked)
		actx, acancel := context.WithTimeout(ctx, wait)
		defer acancel()
		m := control("ack", nil)
		m.Reply = want
		err := nc.PublishMsg(m)
		for err == nil {
			var got *nats.Msg
			select {
			case got = <-answered:
			case <-actx.Done():
				err = actx.Err()
			}
			switch {
			case err != nil || got.Subject != want:
			case got.Header.Get("Status") != "":
				// The server's word that nobody is at the reply subject
				// (a reader gone, or a subject named for another): no
				// answer, and none coming.
				err = nats.ErrNoResponders
			default:
				return nil
			}
		}
		cancel()
		return err
	}
	ack := func() error { return ackWithin(schemas.ReplayAckWait) }
	// The reader answers first, before any reader of the stream is made:
	// its answer proves the reply subject its own (see readers).
	if err := ackWithin(greetingWait); err != nil {
		return // nobody there to tell
	}
	greeted()
	end, err := reads.begin(to)
	if err != nil {
		fail(err)
		return
	}
	defer end()
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
		if ev.RanOn != ev.Node {
			m.Header.Set(schemas.HeaderClosedFor, ev.RanOn)
		}
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
	aged, isAged := errors.AsType[client.Gap](err)
	switch {
	case ctx.Err() != nil:
		// The client went away, or the coordinator is stopping.
	case isAged:
		// Every event from the start point on was dropped: the end
		// says which.
		m := control("end", nil)
		m.Header.Set(schemas.HeaderAgent, aged.Agent)
		m.Header.Set(schemas.HeaderGap, fmt.Sprintf("%d-%d", aged.From, aged.To))
		send(m)
	case err != nil:
		fail(err)
	default:
		send(control("end", nil))
	}
}

// replayFrom reads where a streamed replay starts.
// replayRequest reads a replay request: its agents, each named once, and
// where it starts.
func replayRequest(body []byte) (schemas.ReplayRequest, client.From, error) {
	var req schemas.ReplayRequest
	if err := validate.MustCaller("replay_request").Decode(body, &req); err != nil {
		return req, client.From{}, schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err)
	}
	seen := make(map[string]bool, len(req.Agents))
	for _, id := range req.Agents {
		if seen[id] {
			// Each costs reads of the stream before the server refuses
			// the overlapping readers.
			return req, client.From{}, schemas.Errf(schemas.CodeInvalid, "invalid request: agent %s is named twice in agents", id)
		}
		seen[id] = true
	}
	from, err := replayFrom(req)
	return req, from, err
}

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

// serve is the endpoint of verb, op through the request adapter: a
// request checked against its schema as a caller may send it (what Shoal
// sets itself, such as an open's parent, is refused), the rights rules
// asked for the verb's access, op run within the verb's deadline, and an
// answer only to an inbox (a reply is published with the coordinator's
// rights, and a requester may name any reply subject).
//
// Who asks is a person: the service cannot tell one's credentials from
// another's, but the server lets observer credentials publish only to
// the verbs that read, so a request for any other verb comes from a
// person with every right, and one for a read from an observer at least.
func serve[Req, Rep any](srv *service.Server, verb schemas.Verb, schema string, op func(context.Context, Req) (Rep, error)) micro.Handler {
	access := schemas.FabricVerbs[verb]
	p := schemas.Person(schemas.RoleFull)
	if slices.Contains(schemas.FabricReadVerbs(), verb) {
		p = schemas.Person(schemas.RoleObserver)
	}
	return service.Handler(srv, service.Endpoint[Req]{
		Verb: verb, Schema: validate.MustCaller(schema), InboxOnly: true,
		Deadline: func(r Req) time.Duration { return fabricDeadline(verb, r) },
		Allow: func(req Req) error {
			t := schemas.Target{}
			if a, ok := any(req).(interface{ Agent() string }); ok {
				t.Agent = a.Agent()
			}
			return schemas.Decide(p, access, t).Err(p, string(verb), t)
		},
		Handle: service.Op(op),
	})
}

// fabricDeadline bounds a request of verb: a run waits its own timeout,
// an open as long as a node waits for its agent to start, a close or a
// model switch a stop ladder, the rest briefly.
func fabricDeadline(verb schemas.Verb, req any) time.Duration {
	switch verb {
	case schemas.VerbRun:
		timeout := schemas.DefaultRunTimeout
		if r, ok := req.(schemas.RunRequest); ok {
			if t, err := schemas.RunTimeout(r.Timeout); err == nil {
				timeout = t
			}
		}
		return timeout + time.Minute
	case schemas.VerbOpen:
		return schemas.OpenTimeout + 30*time.Second
	case schemas.VerbClose, schemas.VerbSetModel:
		return 2 * time.Minute
	case schemas.VerbDiff:
		return 90 * time.Second // the node's git has a minute
	}
	return time.Minute
}
