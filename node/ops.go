package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// OpenAgent starts an agent (agent_open) and returns its id once it is ready.
func (h *Host) OpenAgent(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	cwd := req.CWD
	switch {
	case cwd == "":
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "cwd is required")
	case !filepath.IsAbs(cwd):
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent cwd must be an absolute path on node %s: %s", h.cfg.Name, cwd)
	}
	fi, err := os.Stat(cwd)
	switch {
	case err != nil:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent cwd does not exist: %s", cwd)
	case !fi.IsDir():
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent cwd is not a directory: %s", cwd)
	}
	if req.Node != "" && req.Node != h.cfg.Name {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "this is node %s, not %s", h.cfg.Name, req.Node)
	}
	model := req.Model
	if model == "" {
		model = schemas.DefaultModel
	}
	kind, rest := schemas.Route(model)
	be, ok := h.backends[kind]
	if !ok {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeUnavailable, "node %s cannot run %s agents (it runs: %s)", h.cfg.Name, kind, strings.Join(h.kinds(), ", "))
	}
	pol, err := schemas.ComposePolicy(req.Permission, req.PermissionMode, req.AllowedTools, req.DisallowedTools, req.Only)
	if err != nil {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	pol.Ask = pol.Ask || req.Ask
	switch {
	case pol.Ask && pol.Dangerous:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "ask has nothing to ask under the bypass preset, which permits everything")
	case req.AskTimeout < 0:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "ask_timeout must not be negative")
	case req.AskTimeout > 0 && !pol.Ask:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "ask_timeout is how long a person has to answer; this agent does not ask (permission ask, or ask: true)")
	}
	sandboxed, err := h.sandboxWanted(req)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	id := req.ID
	if id == "" {
		id = schemas.NewAgentID()
	} else if err := schemas.ValidID(id); err != nil {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}

	// The limit is checked and the id reserved under one lock, so
	// concurrent opens cannot all see room for themselves. An agent still
	// starting holds its slot.
	h.mu.Lock()
	if max := h.cfg.MaxAgents; max > 0 && h.liveAgentsLocked() >= max {
		h.mu.Unlock()
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeUnavailable, "node %s is full (%d of %d agents)", h.cfg.Name, max, max)
	}
	if old, ok := h.agents[id]; ok && !old.isDead() {
		h.mu.Unlock()
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s", id)
	}
	a := newAgent(h, schemas.AgentRecord{
		ID: id, Status: schemas.StatusStarting, Model: model, CWD: cwd,
		EventLog: filepath.Join(h.cfg.Dir, id+".events.jsonl"),
		Usage:    schemas.Usage{}, Node: h.cfg.Name,
		Policy:    pol.Record(cwd),
		RequestID: req.RequestID,
		Parent:    req.Parent, Depth: req.Depth,
	})
	a.askTimeout = h.cfg.AskTimeout
	if req.AskTimeout > 0 {
		a.askTimeout = time.Duration(req.AskTimeout * float64(time.Second))
	}
	h.agents[id] = a // reserves the id on this node while it starts
	h.mu.Unlock()

	fail := func(err error) (schemas.OpenReply, error) {
		h.mu.Lock()
		if h.agents[id] == a {
			delete(h.agents, id)
		}
		h.mu.Unlock()
		return schemas.OpenReply{}, err
	}
	release, err := h.recs.claim(ctx, a)
	if err != nil {
		return fail(err)
	}
	// From here on the id is this agent's: an open that fails leaves it
	// dead, its stream saying why.
	unclaim := func(err error) (schemas.OpenReply, error) {
		a.failed(ctx, err.Error())
		select { // dead before the answer goes out
		case <-a.done:
		case <-time.After(5 * time.Second):
		}
		return schemas.OpenReply{}, err
	}
	// A reopened id goes on where its previous life ended: its event
	// numbers and its turn numbers continue.
	tails, err := h.tails(ctx, []string{id})
	if err != nil {
		// Without its stream's end the agent cannot number an event.
		release(context.WithoutCancel(ctx))
		return fail(schemas.Errf(schemas.CodeUnavailable, "read the agent's last event: %v", err))
	}
	a.resume(tails[id])
	stderr, err := a.openFiles(filepath.Join(h.cfg.Dir, id+".log"))
	if err != nil {
		return unclaim(schemas.Errf(schemas.CodeInternal, "%v", err))
	}
	// Every process of this life of the agent carries its token, so a
	// restarted node finds what a crash left, wherever it went.
	life := backend.NewLifeToken()
	spec := backend.Spec{
		AgentID: id, CWD: cwd, Model: rest, Effort: req.Effort, Policy: pol,
		MCPConfig: req.MCPConfig, SystemPrompt: req.SystemPrompt, MCP: h.agentEndpoint(id, req.RequestID),
		Dir: h.cfg.Dir,
		Env: append(append([]string(nil), h.cfg.Env...), "SHOAL_AGENT_ID="+id, "SHOAL_NODE="+h.cfg.Name,
			"SHOAL_PARENT_PID="+strconv.Itoa(os.Getpid()), backend.LifeEnv+"="+life),
		Stderr: stderr, Reaper: h.reaper, Logger: a.log,
	}
	if pol.Ask {
		spec.Asker = a
	}
	if sandboxed {
		// Confined before it starts: the wrapper that execs the CLI
		// restricts itself first, and everything after inherits it.
		c, err := h.confine(ctx, be, spec, req.SandboxNet)
		if err != nil {
			return unclaim(err)
		}
		a.atEnd(c.end)
		spec.Sandbox = c.conf
		spec.Env = append(spec.Env, c.env...)
		spec.MCP.URL = c.mcpURL
		a.sandboxed(c.policy)
	}
	startCtx, cancel := context.WithTimeout(ctx, h.cfg.OpenTimeout)
	defer cancel()
	client.LongWait(ctx) // an agent may take a while to start (an ACP handshake)
	sess, err := be.Start(startCtx, spec, a)
	if err != nil {
		code := schemas.CodeInvalid
		switch _, launch := errors.AsType[*backend.LaunchError](err); {
		case startCtx.Err() != nil:
			return unclaim(schemas.Errf(schemas.CodeTimeout, "agent %s did not start within %s: %v", id, h.cfg.OpenTimeout, err))
		case launch:
			code = schemas.CodeUnavailable // this node cannot run it
		}
		return unclaim(schemas.Errf(code, "%v", err))
	}
	if err := h.pids.add(id, sess.Info().PID, life); err != nil {
		a.log.Warn("cannot record the agent's pid", "err", err)
	}
	a.started(ctx, sess)
	h.recs.mark(a, true)
	// Placement reads the node's load from its record: it is current before
	// the reply goes out.
	if err := h.ads.write(ctx); err != nil {
		h.ads.poke()
	}
	a.log.Info("agent opened", "model", model, "cwd", cwd)
	return schemas.OpenReply{AgentID: id, Node: h.cfg.Name}, nil
}

// agentEndpoint is the coordinator's MCP endpoint as one life of an agent
// reaches it: with its own token, never the endpoint's.
func (h *Host) agentEndpoint(id, requestID string) backend.MCPEndpoint {
	e := h.cfg.MCP
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
	turn, err := a.send(ctx, req.Text, nil)
	return schemas.SendReply{Turn: turn}, err
}

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
	if !a.startRun() {
		return schemas.RunReply{}, schemas.Errf(schemas.CodeConflict, "agent '%s' already has a synchronous run in flight", a.id)
	}
	defer a.endRun()
	ch := make(chan runOutcome, 1)
	turn, err := a.send(ctx, req.Text, ch)
	if err != nil {
		return schemas.RunReply{}, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	client.LongWait(ctx)
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
		if err := h.pub.waitStored(wctx, a.id, out.seq); err != nil {
			h.log.Warn("answering a run before its turn is stored", "agent", a.id, "err", err)
		}
		return fitRunReply(schemas.RunReply{Text: out.text, Turn: turn, StopReason: out.stop}, h.maxEvent), nil
	case <-t.C:
		return schemas.RunReply{}, schemas.Errf(schemas.CodeTimeout, "agent '%s' run timed out after %ss", a.id, juliaFloat(timeout.Seconds()))
	case <-ctx.Done():
		return schemas.RunReply{}, schemas.Errf(schemas.CodeTimeout, "agent '%s' run abandoned: %v", a.id, ctx.Err())
	}
}

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
	client.LongWait(ctx) // the backend acknowledges the cancel
	return schemas.InterruptReply{Interrupted: a.interrupt(ctx)}, nil
}

// CloseAgent stops an agent (agent_close); the slot is kept as dead for review.
// An unknown id is not an error: the reply says closed false.
func (h *Host) CloseAgent(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	if err := schemas.ValidID(req.AgentID); err != nil {
		return schemas.CloseReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.CloseReply{Closed: false}, nil
	}
	client.LongWait(ctx) // the agent's stop ladder
	a.close(ctx)
	// Whoever replays the agent next finds its closing events there.
	wctx, cancel := context.WithTimeout(ctx, storedWait)
	defer cancel()
	if err := h.pub.waitStored(wctx, a.id, a.lastSeq()); err != nil {
		h.log.Warn("answering a close before its events are stored", "agent", a.id, "err", err)
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
	a, err := h.lookup(req.AgentID)
	if err != nil {
		return schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is not on node %s", req.AgentID, h.cfg.Name)}, nil
	}
	if a.isDead() {
		return schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is dead", req.AgentID)}, nil
	}
	ms, ok := a.sess.(backend.ModelSetter)
	if !ok {
		a.mu.Lock()
		kind, _ := schemas.Route(a.rec.Model)
		a.mu.Unlock()
		return schemas.SetModelReply{Reason: fmt.Sprintf("%s CLI agents cannot switch models in place; open a new agent with --model", kind)}, nil
	}
	client.LongWait(ctx)
	model, err := ms.SetModel(ctx, req.Model)
	if err != nil {
		a.log.Info("set_model refused", "model", req.Model, "err", err)
		return schemas.SetModelReply{Reason: err.Error()}, nil
	}
	a.setModel(model) // as the backend reads it back, prefix and all
	return schemas.SetModelReply{Switched: true}, nil
}
