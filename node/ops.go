package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// agentEndpoint is the coordinator's MCP endpoint as one life of an agent
// reaches it: with its own token, derived from the node's key, never the
// key itself.
func (h *Host) agentEndpoint(id, requestID string) backend.MCPEndpoint {
	h.mcpMu.Lock()
	e := h.mcp
	h.mcpMu.Unlock()
	if e.Token != "" {
		e.Token = schemas.AgentToken(e.Token, id, requestID)
	}
	return e
}

// liveAgentsLocked counts the agents that are not dead, starting ones
// included; h.mu is held.
func (h *Host) liveAgentsLocked() int {
	n := 0
	for _, a := range h.agents {
		if !a.isDead() {
			n++
		}
	}
	return n
}

// lookup finds an agent this node keeps.
func (h *Host) lookup(id string) (*agent, error) {
	if err := schemas.ValidID(id); err != nil {
		return nil, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.agents[id]
	if !ok {
		return nil, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
	}
	return a, nil
}

// live finds an agent that can take a turn.
func (h *Host) live(id string) (*agent, error) {
	if h.isOpening(id) {
		if a, err := h.lookup(id); err != nil || a.isDead() {
			// Not reserved yet (its checkout being made), or a
			// life before this open's.
			return nil, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is still starting: send the turn once it is idle", id)
		}
	}
	a, err := h.lookup(id)
	if err != nil {
		return nil, err
	}
	if a.isDead() {
		return nil, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead", id)
	}
	return a, nil
}

// Send writes a user turn (agent_send) and returns its number at once.
// The turn begins when the running one ends; what becomes of it is on the
// agent's stream.
func (h *Host) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	a, err := h.live(req.AgentID)
	if err != nil {
		return schemas.SendReply{}, err
	}
	if err := a.refuseOverBudget(ctx); err != nil {
		return schemas.SendReply{}, err
	}
	turn, err := a.send(ctx, req.Text, nil)
	return schemas.SendReply{Turn: turn}, err
}

// awaitConnected reports, once nc is connected, true, or false if ctx
// ends or nc is closed first.
func awaitConnected(ctx context.Context, nc *nats.Conn) bool {
	back := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(back)
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-back:
		case <-time.After(time.Second): // a change the listener missed
		}
	}
	return true
}

// replySettle is how long a reply held for the connection waits once it
// is back.
const replySettle = 3 * time.Second

// storedWait bounds how long a run's reply waits for its turn to be stored.
const storedWait = 10 * time.Second

// RunTurn sends a turn and waits for it to end (agent_run), returning its
// authoritative assistant text. One synchronous run per agent at a time.
func (h *Host) RunTurn(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	timeout, err := schemas.RunTimeout(req.Timeout)
	if err != nil {
		return schemas.RunReply{}, err
	}
	a, err := h.live(req.AgentID)
	if err != nil {
		return schemas.RunReply{}, err
	}
	if err := a.refuseOverBudget(ctx); err != nil {
		return schemas.RunReply{}, err
	}
	if !a.startRun() {
		return schemas.RunReply{}, schemas.Errf(schemas.CodeConflict, "agent '%s' already has a synchronous run in flight", a.id)
	}
	defer a.endRun()
	ch := make(chan runOutcome, 1)
	turn, err := a.send(ctx, req.Text, ch)
	if err != nil {
		return schemas.RunReply{}, err
	}
	// From here the turn is the agent's: whatever the reply, a copy of
	// the request is answered with it (sent turn), never run again, and
	// it waits for the connection (heldForConnection).
	rep, err := h.awaitRun(ctx, a, turn, timeout, ch)
	h.heldForConnection(ctx, a.id, turn)
	if err != nil {
		return rep, sentTurn{err}
	}
	return rep, nil
}

// awaitRun waits for the turn a run sent to end, for timeout, or for
// ctx.
func (h *Host) awaitRun(ctx context.Context, a *agent, turn int, timeout time.Duration, ch chan runOutcome) (schemas.RunReply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	service.LongWait(ctx)
	select {
	case out := <-ch:
		if out.died {
			return schemas.RunReply{}, schemas.Errf(schemas.CodeUnavailable, "agent '%s' died during the turn", a.id)
		}
		// Whoever reads the turn back from the stream next (agent_output
		// after agent_run) finds it there. While the fabric is away the
		// reply could not leave anyway; it waits a little, not forever.
		wctx, cancel := context.WithTimeout(ctx, storedWait)
		defer cancel()
		if err := h.pub.waitStored(wctx, a.id, out.seq); errors.Is(err, errTakenForLost) {
			return schemas.RunReply{}, schemas.Errf(schemas.CodeUnavailable, "agent '%s' was taken for lost while its node was away: the fabric closed its turn as cancelled", a.id)
		} else if err != nil {
			h.log.Warn("answering a run before its turn is stored", "agent", a.id, "err", err)
		}
		return fitRunReply(schemas.RunReply{Text: out.text, Turn: turn, StopReason: out.stop, NotBegun: out.notBegun}, h.maxEvent), nil
	case <-t.C:
		return schemas.RunReply{}, schemas.Errf(schemas.CodeTimeout, "agent '%s' run timed out after %ss", a.id, juliaFloat(timeout.Seconds()))
	case <-ctx.Done():
		return schemas.RunReply{}, schemas.Errf(schemas.CodeTimeout, "agent '%s' run abandoned: %v", a.id, ctx.Err())
	}
}

// heldForConnection returns once the node's connection is up: a reply
// sent while it is away is lost (nothing buffers it), and the caller
// would wait out its deadline for a turn that ended. It waits as long as
// the caller waits, then a moment more, so that a caller reconnecting at
// the same moment has its reply subject again.
func (h *Host) heldForConnection(ctx context.Context, id string, turn int) {
	if h.cfg.Conn.IsConnected() {
		return
	}
	h.log.Info("holding a run's reply until the fabric is back", "agent", id, "turn", turn)
	if awaitConnected(ctx, h.cfg.Conn) {
		select {
		case <-ctx.Done():
		case <-time.After(replySettle):
		}
	}
}

// sentTurn is the failure of a request that had already sent its turn
// (the run timed out, the agent died): kept as the request's reply, so a
// copy of it is answered so and does not send the turn again.
type sentTurn struct{ error }

func (e sentTurn) Unwrap() error { return e.error }

// fitRunReply cuts a run's text so that its reply fits in a message, with
// the marker the stream uses where it cuts an event.
func fitRunReply(rep schemas.RunReply, limit int) schemas.RunReply {
	for {
		b, _ := json.Marshal(rep)
		over := len(b) - limit
		if over <= 0 || rep.Text == "" {
			return rep
		}
		keep := max(0, len(rep.Text)-over-256)
		for keep > 0 && !utf8.RuneStart(rep.Text[keep]) {
			keep-- // do not split a UTF-8 sequence
		}
		cut := len(rep.Text) - keep
		rep.Text = rep.Text[:keep] + schemas.TruncationMarker(cut+rep.DroppedBytes)
		rep.Truncated, rep.DroppedBytes = true, rep.DroppedBytes+cut
	}
}

// juliaFloat formats seconds the way Kaimon does: 600.0, 1.5.
func juliaFloat(x float64) string {
	s := strconv.FormatFloat(x, 'f', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

// Interrupt cancels an agent's running turn and the turns held behind it
// (agent_interrupt). Each held turn is still published in its place, as
// begun and cancelled.
func (h *Host) Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.InterruptReply{}, err
	}
	service.LongWait(ctx) // the backend acknowledges the cancel
	return schemas.InterruptReply{Interrupted: a.interrupt(ctx)}, nil
}

// CloseAgent stops an agent (agent_close); the slot is kept as dead for review.
// An unknown id is not an error: the reply says closed false.
func (h *Host) CloseAgent(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	if err := schemas.ValidID(req.AgentID); err != nil {
		return schemas.CloseReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	opening := h.isOpening(req.AgentID)
	if opening {
		// Its open ends first (a checkout being made, a start): what it
		// leaves, if anything, is closed below.
		service.LongWait(ctx)
		h.stopOpening(ctx, req.AgentID)
	}
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.CloseReply{Closed: opening}, nil
	}
	service.LongWait(ctx) // the agent's stop ladder
	a.close(ctx)
	// Whoever replays the agent next finds its closing events there.
	wctx, cancel := context.WithTimeout(ctx, storedWait)
	defer cancel()
	if err := h.pub.waitStored(wctx, a.id, a.lastSeq()); err != nil {
		h.log.Warn("answering a close before its events are stored", "agent", a.id, "err", err)
	}
	// And its record says dead: an open of the id right after the answer
	// is a new life, not "already in use".
	if err := h.recs.writeNow(wctx, a); err != nil {
		h.log.Warn("answering a close before its record says dead", "agent", a.id, "err", err)
	}
	return schemas.CloseReply{Closed: true}, nil
}

// AgentStatus returns an agent's record (agent_status).
func (h *Host) AgentStatus(_ context.Context, req schemas.AgentRequest) (schemas.AgentRecord, error) {
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.AgentRecord{}, err
	}
	return a.record(), nil
}

// ListAgents returns the records of every agent the node keeps, dead ones
// included (agent_list).
func (h *Host) ListAgents(context.Context, schemas.ListRequest) (schemas.ListReply, error) {
	h.mu.Lock()
	agents := make([]*agent, 0, len(h.agents))
	for _, a := range h.agents {
		agents = append(agents, a)
	}
	h.mu.Unlock()
	out := schemas.ListReply{Agents: []schemas.AgentRecord{}}
	for _, a := range agents {
		out.Agents = append(out.Agents, a.record())
	}
	return out, nil
}

// SetModel repoints a live agent at another model (agent_set_model); only
// backends that can switch in place do, everyone else answers false.
func (h *Host) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	if req.Model == "" {
		return schemas.SetModelReply{}, schemas.Errf(schemas.CodeInvalid, "model is required")
	}
	if err := schemas.ValidModel(req.Model); err != nil {
		return schemas.SetModelReply{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is not on node %s", req.AgentID, h.cfg.Name)}, nil
	}
	if a.isDead() {
		return schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is dead", req.AgentID)}, nil
	}
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess == nil {
		return schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is still starting", req.AgentID)}, nil
	}
	ms, ok := sess.(backend.ModelSetter)
	if !ok {
		a.mu.Lock()
		kind, _ := schemas.Route(a.rec.Model)
		a.mu.Unlock()
		return schemas.SetModelReply{Reason: fmt.Sprintf("%s CLI agents cannot switch models in place; open a new agent with --model", kind)}, nil
	}
	service.LongWait(ctx)
	model, err := ms.SetModel(ctx, req.Model)
	if err != nil {
		a.log.Info("set_model refused", "model", req.Model, "err", err)
		return schemas.SetModelReply{Reason: err.Error()}, nil
	}
	a.setModel(model) // as the backend reads it back, prefix and all
	return schemas.SetModelReply{Switched: true}, nil
}
