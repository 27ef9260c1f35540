package bridge

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
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/schemas"
)

// viaCoordinator sends one request to the coordinator's fabric service,
// for a Fabric whose credentials reach neither the nodes nor the stream.
// A request the coordinator did not get (it was briefly away) is sent
// again once; requests that change state carry their request id, so the
// owner recognises a retry.
func (f *Fabric) viaCoordinator(ctx context.Context, verb string, req, rep any, timeout time.Duration) error {
	if f.readOnly && !slices.Contains(schemas.FabricReadVerbs, verb) {
		return schemas.Errf(schemas.CodeInvalid, "these credentials may only observe: %s needs client credentials (shoal creds client NAME)", verb)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok || timeout > 0 {
		if timeout == 0 {
			timeout = f.timeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var msg *nats.Msg
	for attempt := 0; ; attempt++ {
		msg, err = f.nc.RequestWithContext(ctx, FabricSubject(verb), body)
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
		return schemas.Errf(schemas.CodeUnavailable, "no coordinator answers %s (is `shoal up` running?)", FabricSubject(verb))
	case errors.Is(err, context.DeadlineExceeded):
		return schemas.Errf(schemas.CodeTimeout, "the coordinator did not answer %s in time", verb)
	case err != nil:
		return schemas.Errf(schemas.CodeUnavailable, "%s request to the coordinator: %v", verb, err)
	}
	return schemas.DecodeReply(msg.Data, rep)
}

// Flow control of a streamed replay: the coordinator asks the client to
// answer every replayAckEvery events and after replayIdle without one, and
// stops when an answer takes longer than replayAckWait. The client gives
// up when it hears nothing for replayLost.
const (
	replayAckEvery = 256
	replayIdle     = 5 * time.Second
	replayAckWait  = 30 * time.Second
	replayLost     = 3 * replayIdle
)

// serveReplay streams a replay to the reply subject of r: each event with
// its headers, the gaps, acknowledgement requests for flow control, and
// an end or an error.
func (f *Fabric) serveReplay(ctx context.Context, r micro.Request) {
	to := r.Reply()
	send := func(m *nats.Msg) error {
		m.Subject = to
		return f.nc.PublishMsg(m)
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
		send(control("error", body))
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
		actx, acancel := context.WithTimeout(ctx, replayAckWait)
		defer acancel()
		_, err := f.nc.RequestMsgWithContext(actx, control("ack", nil))
		if err != nil {
			cancel()
		}
		return err
	}
	// While the replay waits for live events, the client still hears from
	// it, and a client that went away is noticed.
	heard := make(chan struct{}, 1)
	go func() {
		t := time.NewTicker(replayIdle)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-heard:
				t.Reset(replayIdle)
			case <-t.C:
				if ack() != nil {
					return
				}
			}
		}
	}()
	sent := 0
	err = f.Replay(ctx, req.Agents, from, req.Follow, func(ev Replayed, gap *Gap) error {
		m := nats.NewMsg(to)
		m.Data = ev.Raw
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
		if sent++; sent%replayAckEvery == 0 {
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
func replayFrom(req schemas.ReplayRequest) (From, error) {
	var from From
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

// replayViaCoordinator is Replay for a client that may not read the
// stream: the coordinator replays and streams the events to its inbox.
func (f *Fabric) replayViaCoordinator(ctx context.Context, ids []string, from From, follow bool, fn func(Replayed, *Gap) error) error {
	req := schemas.ReplayRequest{Agents: ids, FromEvent: from.Event, FromTurn: from.Turn, New: from.New, Follow: follow}
	if !from.Time.IsZero() {
		req.Since = from.Time.UTC().Format(time.RFC3339Nano)
	}
	body, _ := json.Marshal(req)
	inbox := f.nc.NewInbox()
	msgs := make(chan *nats.Msg, 4*replayAckEvery)
	sub, err := f.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := f.nc.PublishMsg(&nats.Msg{Subject: FabricSubject("replay"), Reply: inbox, Data: body}); err != nil {
		return err
	}
	lost := time.NewTimer(replayLost)
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
		lost.Reset(replayLost)
		if m.Header.Get("Status") == "503" {
			return schemas.Errf(schemas.CodeUnavailable, "no coordinator answers %s (is `shoal up` running?)", FabricSubject("replay"))
		}
		switch m.Header.Get(schemas.HeaderReplay) {
		case "ack":
			m.Respond(nil)
			continue
		case "end":
			return nil
		case "error":
			var rep struct{}
			return schemas.DecodeReply(m.Data, &rep)
		}
		r, gap, err := remoteReplayed(m)
		if err != nil {
			return err
		}
		if err := fn(r, gap); err != nil {
			return done(err)
		}
	}
}

// remoteReplayed reads an event of a streamed replay.
func remoteReplayed(m *nats.Msg) (Replayed, *Gap, error) {
	var r Replayed
	var err error
	if r.Agent, r.N, err = schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID)); err != nil {
		return r, nil, fmt.Errorf("replay: %w", err)
	}
	r.Seq, _ = strconv.ParseUint(m.Header.Get(schemas.HeaderSeq), 10, 64)
	r.Time, _ = time.Parse(time.RFC3339Nano, m.Header.Get(schemas.HeaderStored))
	r.Node = m.Header.Get(schemas.HeaderNode)
	r.Raw = m.Data
	if r.Kind, r.Turn, r.Delta, err = schemas.Peek(m.Data); err != nil {
		return r, nil, fmt.Errorf("replay: event %d of agent %s: %w", r.N, r.Agent, err)
	}
	var gap *Gap
	if g := m.Header.Get(schemas.HeaderGap); g != "" {
		a, b, _ := strings.Cut(g, "-")
		gap = &Gap{Agent: r.Agent}
		gap.From, _ = strconv.ParseUint(a, 10, 64)
		gap.To, _ = strconv.ParseUint(b, 10, 64)
	}
	return r, gap, nil
}
