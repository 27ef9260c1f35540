package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// Remote is a client for credentials that reach neither the nodes nor the
// stream (scoped client and observer credentials): every request goes
// through the coordinator's fabric service, shoal.fabric.<verb>, which
// acts with its own rights.
type Remote struct {
	nc       *nats.Conn
	timeout  time.Duration
	readOnly bool
	progress func(string) // Config.Progress
}

// NewRemote returns a client on nc that goes through the coordinator.
func NewRemote(nc *nats.Conn, cfg Config) *Remote {
	return &Remote{nc: nc, timeout: cfg.timeout(), readOnly: cfg.ReadOnly, progress: cfg.Progress}
}

// Conn implements Client.
func (r *Remote) Conn() *nats.Conn { return r.nc }

// Open implements Client: placement is the coordinator's.
func (r *Remote) Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.OpenReply
	return rep, r.via(ctx, schemas.VerbOpen, req, &rep, 0)
}

// Send implements Client.
func (r *Remote) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SendReply
	return rep, r.via(ctx, schemas.VerbSend, req, &rep, 0)
}

// Run implements Client; the coordinator watches the agent's record.
func (r *Remote) Run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	timeout, err := schemas.RunTimeout(req.Timeout)
	if err != nil {
		return schemas.RunReply{}, err
	}
	req.RequestID = requestID(req.RequestID)
	var rep schemas.RunReply
	return rep, r.via(ctx, schemas.VerbRun, req, &rep, timeout+60*time.Second)
}

// Interrupt implements Client.
func (r *Remote) Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.InterruptReply
	return rep, r.via(ctx, schemas.VerbInterrupt, req, &rep, 0)
}

// Close implements Client.
func (r *Remote) Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.CloseReply
	return rep, r.via(ctx, schemas.VerbClose, req, &rep, 0)
}

// SetModel implements Client.
func (r *Remote) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SetModelReply
	return rep, r.via(ctx, schemas.VerbSetModel, req, &rep, 0)
}

// Output implements Client.
func (r *Remote) Output(ctx context.Context, req schemas.OutputRequest) (schemas.OutputReply, error) {
	var rep schemas.OutputReply
	return rep, r.via(ctx, schemas.VerbOutput, req, &rep, 0)
}

// Status implements Client.
func (r *Remote) Status(ctx context.Context, id string) (schemas.AgentRecord, error) {
	var rep schemas.AgentRecord
	return rep, r.via(ctx, schemas.VerbStatus, schemas.AgentRequest{AgentID: id}, &rep, 0)
}

// Record implements Client.
func (r *Remote) Record(ctx context.Context, id string) (schemas.AgentRecord, error) {
	if err := schemas.ValidID(id); err != nil {
		return schemas.AgentRecord{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	var rec schemas.AgentRecord
	return rec, r.via(ctx, schemas.VerbRecord, schemas.AgentRequest{AgentID: id}, &rec, 0)
}

// List implements Client.
func (r *Remote) List(ctx context.Context) ([]schemas.AgentRecord, error) {
	// Page by page, then in the order they were made, as Direct lists
	// them. A coordinator of an earlier version (any of them, in a
	// cluster being upgraded) refuses pages: the list is asked again
	// whole, as it answers it.
	var all []schemas.AgentRecord
	req := schemas.FabricListRequest{Paged: true}
	for {
		var rep schemas.ListReply
		err := r.via(ctx, schemas.VerbList, req, &rep, 0)
		if schemas.CodeOf(err) == schemas.CodeInvalid && strings.Contains(err.Error(), "Unknown parameter(s)") {
			rep = schemas.ListReply{}
			if err := r.via(ctx, schemas.VerbList, schemas.FabricListRequest{}, &rep, 0); err != nil {
				return nil, err
			}
			SortByCreation(rep.Agents)
			return rep.Agents, nil
		}
		if err != nil {
			return nil, err
		}
		all = append(all, rep.Agents...)
		if rep.Next == "" {
			break
		}
		if rep.Next <= req.After {
			return nil, schemas.Errf(schemas.CodeInternal, "the coordinator's list went back (next %q after %q)", rep.Next, req.After)
		}
		req.After = rep.Next
	}
	SortByCreation(all)
	return all, nil
}

// Nodes implements Client: page by page, by name. A coordinator of an
// earlier version refuses pages, and is asked for the list whole.
func (r *Remote) Nodes(ctx context.Context) ([]schemas.NodeRecord, error) {
	all := []schemas.NodeRecord{}
	req := schemas.FabricNodesRequest{Paged: true}
	for {
		var rep schemas.NodesReply
		err := r.via(ctx, schemas.VerbNodes, req, &rep, 0)
		if schemas.CodeOf(err) == schemas.CodeInvalid && strings.Contains(err.Error(), "Unknown parameter(s)") {
			rep = schemas.NodesReply{}
			return rep.Nodes, r.via(ctx, schemas.VerbNodes, struct{}{}, &rep, 0)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, rep.Nodes...)
		if rep.Next == "" {
			return all, nil
		}
		if rep.Next <= req.After {
			return nil, schemas.Errf(schemas.CodeInternal, "the coordinator's list of nodes went back (next %q after %q)", rep.Next, req.After)
		}
		req.After = rep.Next
	}
}

// Events implements Client.
func (r *Remote) Events(ctx context.Context, req schemas.EventsRequest) (schemas.EventsReply, error) {
	rep := schemas.EventsReply{AgentID: req.AgentID, Events: []schemas.StoredEvent{}, Gaps: []schemas.EventGap{}}
	return rep, r.via(ctx, schemas.VerbEvents, req, &rep, 0)
}

// Diff is an agent's work on a repository against its start, which the
// coordinator asks its node for (the other repository commands need the
// object store, which scoped credentials do not reach).
func (r *Remote) Diff(ctx context.Context, id string, stat bool) (schemas.DiffReply, error) {
	var rep schemas.DiffReply
	return rep, r.via(ctx, schemas.VerbDiff, schemas.DiffRequest{AgentID: id, Stat: stat}, &rep, 90*time.Second)
}

// via sends one request to the coordinator's fabric service.
// A request the coordinator did not get (it was briefly away) is sent
// again once, and one whose reply is lost with the connection (the
// coordinator died with it, or the link went) is sent again once the
// connection is back: requests that change state carry their request id,
// and the node that acts on them answers a copy with its first reply (a
// budget sets a value; a person's permit answer, which has no request id,
// is sent once).
func (r *Remote) via(ctx context.Context, verb schemas.Verb, req, rep any, timeout time.Duration) error {
	if r.readOnly && !slices.Contains(schemas.FabricReadVerbs(), verb) {
		return schemas.Errf(schemas.CodeInvalid, "these credentials may only observe: %s needs client credentials (shoal creds client NAME)", verb)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok || timeout > 0 {
		if timeout == 0 {
			timeout = r.timeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var msg *nats.Msg
	for attempt := 0; ; attempt++ {
		if verb == schemas.VerbPermit {
			// An answer carries no request id: the node takes the first
			// and refuses a copy, so a copy would return the caller's own
			// answer as a conflict.
			msg, err = r.nc.RequestWithContext(ctx, schemas.FabricSubject(verb), body)
		} else {
			msg, err = requestAcross(ctx, r.nc, schemas.FabricSubject(verb), r.nc.NewInbox(), body, unavailable, keepaliveEvery, r.progress)
		}
		if !errors.Is(err, nats.ErrNoResponders) || attempt > 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return schemas.Errf(schemas.CodeUnavailable, "no coordinator answers %s (is `shoal up` running?)", schemas.FabricSubject(verb))
	case errors.Is(err, context.DeadlineExceeded):
		return schemas.Errf(schemas.CodeTimeout, "the coordinator did not answer %s in time", verb)
	case errors.Is(err, context.Canceled):
		// The caller stopped waiting: the fabric was not found wanting.
		return fmt.Errorf("%s request to the coordinator: %w", verb, err)
	case errors.Is(err, nats.ErrConnectionClosed):
		return schemas.Errf(schemas.CodeUnavailable, "%s request to the coordinator: the connection to the fabric closed, the fabric away longer than this client tries to reconnect; what the agent did meanwhile is in its stream (shoal output, shoal tail)", verb)
	case err != nil:
		return schemas.Errf(schemas.CodeUnavailable, "%s request to the coordinator: %v", verb, err)
	}
	return schemas.DecodeReply(msg.Data, rep)
}

// unavailable is whether a reply of the fabric service says that what it
// asked was not there (a node not reconnected yet).
func unavailable(m *nats.Msg) bool {
	var none struct{}
	return schemas.CodeOf(schemas.DecodeReply(m.Data, &none)) == schemas.CodeUnavailable
}

// Replay implements Client: the coordinator replays and streams the
// events to the client's inbox, with flow control.
func (r *Remote) Replay(ctx context.Context, ids []string, from From, follow bool, fn func(Replayed, *Gap) error) error {
	if (from.Event > 0 || from.Turn > 0) && len(ids) != 1 {
		return schemas.Errf(schemas.CodeInvalid, "a replay from an event number or a turn names one agent")
	}
	req := schemas.ReplayRequest{Agents: ids, FromEvent: from.Event, FromTurn: from.Turn, New: from.New, Follow: follow}
	if !from.Time.IsZero() {
		req.Since = from.Time.UTC().Format(time.RFC3339Nano)
	}
	body, _ := json.Marshal(req)
	inbox := r.nc.NewInbox()
	msgs := make(chan *nats.Msg, 4*schemas.ReplayAckEvery)
	sub, err := r.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := r.nc.PublishMsg(&nats.Msg{Subject: schemas.FabricSubject(schemas.VerbReplay), Reply: inbox, Data: body}); err != nil {
		return err
	}
	lost := time.NewTimer(schemas.ReplayLost)
	defer lost.Stop()
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return nil
		case <-lost.C:
			return schemas.Errf(schemas.CodeUnavailable, "the coordinator stopped streaming the replay")
		case m = <-msgs:
		}
		lost.Reset(schemas.ReplayLost)
		if m.Header.Get("Status") == "503" {
			return schemas.Errf(schemas.CodeUnavailable, "no coordinator answers %s (is `shoal up` running?)", schemas.FabricSubject(schemas.VerbReplay))
		}
		switch m.Header.Get(schemas.HeaderReplay) {
		case "ack":
			m.Respond(nil)
			continue
		case "end":
			if g := m.Header.Get(schemas.HeaderGap); g != "" {
				// Nothing stored of the agent from the start point on.
				return parseGap(m.Header.Get(schemas.HeaderAgent), g)
			}
			return nil
		case "error":
			var rep struct{}
			return schemas.DecodeReply(m.Data, &rep)
		}
		ev, gap, err := remoteReplayed(m)
		if err != nil {
			return err
		}
		if err := fn(ev, gap); err != nil {
			return done(err)
		}
	}
}

// remoteReplayed reads an event of a streamed replay.
func remoteReplayed(m *nats.Msg) (Replayed, *Gap, error) {
	var r Replayed
	var err error
	if why := m.Header.Get(schemas.HeaderStray); why != "" {
		r.Stray, r.Agent, r.Raw = why, m.Header.Get(schemas.HeaderAgent), m.Data
		r.Seq, _ = strconv.ParseUint(m.Header.Get(schemas.HeaderSeq), 10, 64)
		_, r.N, _ = schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID))
		return r, nil, nil
	}
	if r.Agent, r.N, err = schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID)); err != nil {
		return r, nil, fmt.Errorf("replay: %w", err)
	}
	r.Seq, _ = strconv.ParseUint(m.Header.Get(schemas.HeaderSeq), 10, 64)
	r.Time, _ = time.Parse(time.RFC3339Nano, m.Header.Get(schemas.HeaderStored))
	r.Node = m.Header.Get(schemas.HeaderNode)
	r.RanOn = schemas.RanOn(r.Node, m.Header.Get(schemas.HeaderClosedFor))
	r.Raw = m.Data
	if r.Kind, r.Turn, r.Delta, err = schemas.Peek(m.Data); err != nil {
		return r, nil, fmt.Errorf("replay: event %d of agent %s: %w", r.N, r.Agent, err)
	}
	var gap *Gap
	if g := m.Header.Get(schemas.HeaderGap); g != "" {
		gp := parseGap(r.Agent, g)
		gap = &gp
	}
	return r, gap, nil
}

// parseGap reads a schemas.HeaderGap value, "<from>-<to>", of agent.
func parseGap(agent, v string) Gap {
	a, b, _ := strings.Cut(v, "-")
	g := Gap{Agent: agent}
	g.From, _ = strconv.ParseUint(a, 10, 64)
	g.To, _ = strconv.ParseUint(b, 10, 64)
	return g
}
