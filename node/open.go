package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// An open is a plan, made from the request before anything is touched
// (planOpen: everything a request can be refused for without claiming
// its id), then its steps: the id reserved on this node, its record
// claimed, its stream's end read, its files opened, its sandbox set up,
// its backend started.

// openPlan is an open as it will be carried out.
type openPlan struct {
	id, cwd, model string
	be             backend.Backend
	spec           backend.Spec // without what the steps add: files, life, sandbox
	sandboxed      bool
	readable       []string // beside what its backend reads: the cache of its repository
	askTimeout     time.Duration
	rec            schemas.AgentRecord // the record it starts with
}

// within holds an agent's child to its parent's directory (req.Within)
// on this node's filesystem, which the coordinator's door may not see:
// the child's directory and MCP config are resolved here, symbolic links
// followed as the kernel will, refused outside it, and passed on
// resolved, so a link swapped afterwards changes nothing.
func (h *Host) within(req *schemas.OpenRequest) error {
	if req.Beneath != "" {
		// The family's first directory: no agent of it can rename it, so
		// it is resolved by name; what lies inside it is opened from it
		// (proc.Confinement.Beneath).
		root, err := filepath.EvalSymlinks(req.Beneath)
		if err != nil || !filepath.IsAbs(req.Beneath) {
			return schemas.Errf(schemas.CodeForbidden, "the directory %s the agent is held beneath cannot be resolved on node %s", req.Beneath, h.cfg.Name)
		}
		req.Beneath = root
		if req.Within == "" {
			req.Within = root
		}
	}
	if req.Within == "" {
		return nil
	}
	root, err := filepath.EvalSymlinks(req.Within)
	if err != nil || !filepath.IsAbs(req.Within) {
		return schemas.Errf(schemas.CodeForbidden, "the parent's directory %s cannot be resolved on node %s: its child cannot be held inside it here", req.Within, h.cfg.Name)
	}
	for _, p := range []*string{&req.CWD, &req.MCPConfig} {
		if *p == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(*p)
		switch {
		case err != nil || !filepath.IsAbs(*p):
			return schemas.Errf(schemas.CodeForbidden, "path %s cannot be resolved inside the parent's directory %s on node %s", *p, req.Within, h.cfg.Name)
		case !schemas.Within(root, real):
			return schemas.Errf(schemas.CodeForbidden, "path %s is outside the parent's directory %s on node %s (it resolves to %s)", *p, req.Within, h.cfg.Name, real)
		}
		*p = real
	}
	if req.Beneath != "" && !schemas.Within(req.Beneath, req.CWD) {
		return schemas.Errf(schemas.CodeForbidden, "path %s is outside the directory %s its family is held beneath on node %s", req.CWD, req.Beneath, h.cfg.Name)
	}
	return nil
}

// planOpen checks an open request and plans it.
func (h *Host) planOpen(req schemas.OpenRequest) (openPlan, error) {
	p := openPlan{cwd: req.CWD, model: req.Model, askTimeout: h.cfg.AskTimeout}
	switch {
	case p.cwd == "":
		return p, schemas.Errf(schemas.CodeInvalid, "cwd is required")
	case !filepath.IsAbs(p.cwd):
		return p, schemas.Errf(schemas.CodeInvalid, "agent cwd must be an absolute path on node %s: %s", h.cfg.Name, p.cwd)
	}
	switch fi, err := os.Stat(p.cwd); {
	case err != nil:
		// Kaimon's words, then where: on a pool of machines the
		// directory must be on the node placement chose.
		return p, schemas.Errf(schemas.CodeInvalid, "agent cwd does not exist: %s (on node %s)", p.cwd, h.cfg.Name)
	case !fi.IsDir():
		return p, schemas.Errf(schemas.CodeInvalid, "agent cwd is not a directory: %s (on node %s)", p.cwd, h.cfg.Name)
	}
	if req.Node != "" && req.Node != h.cfg.Name {
		return p, schemas.Errf(schemas.CodeInvalid, "this is node %s, not %s", h.cfg.Name, req.Node)
	}
	if p.model == "" {
		p.model = schemas.DefaultModel
	}
	if err := schemas.ValidModel(p.model); err != nil {
		return p, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	kind, rest := schemas.Route(p.model)
	var ok bool
	if p.be, ok = h.backends[kind]; !ok {
		return p, schemas.Errf(schemas.CodeUnavailable, "node %s cannot run %s agents (it runs: %s)", h.cfg.Name, kind, strings.Join(h.kinds(), ", "))
	}
	pol, err := schemas.ComposePolicy(req.Permission, req.PermissionMode, req.AllowedTools, req.DisallowedTools, req.Only)
	if err != nil {
		return p, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	pol.Ask = pol.Ask || req.Ask
	switch {
	case pol.Ask && pol.Dangerous:
		return p, schemas.Errf(schemas.CodeInvalid, "ask has nothing to ask under the bypass preset, which permits everything")
	case req.AskTimeout < 0:
		return p, schemas.Errf(schemas.CodeInvalid, "ask_timeout must not be negative")
	case req.AskTimeout > 0 && !pol.Ask:
		return p, schemas.Errf(schemas.CodeInvalid, "ask_timeout is how long a person has to answer; this agent does not ask (permission ask, or ask: true)")
	case req.AskTimeout > 0:
		p.askTimeout = time.Duration(req.AskTimeout * float64(time.Second))
	}
	if p.sandboxed, err = h.sandboxWanted(req); err != nil {
		return p, err
	}
	if p.id = req.ID; p.id == "" {
		p.id = schemas.NewAgentID()
	} else if err := schemas.ValidID(p.id); err != nil {
		return p, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	p.spec = backend.Spec{
		AgentID: p.id, CWD: p.cwd, Beneath: req.Beneath, Model: rest, Effort: req.Effort, Policy: pol,
		MCPConfig: req.MCPConfig, SystemPrompt: req.SystemPrompt, MCP: h.agentEndpoint(p.id, req.RequestID),
		Dir: h.cfg.Dir,
	}
	// What the backend would refuse is refused before the id is claimed.
	if c, ok := p.be.(backend.Checker); ok {
		if err := c.Check(p.spec); err != nil {
			return p, schemas.Errf(schemas.CodeInvalid, "%v", err)
		}
	}
	p.rec = schemas.AgentRecord{
		ID: p.id, Status: schemas.StatusStarting, Model: p.model, CWD: p.cwd,
		EventLog: filepath.Join(h.cfg.Dir, p.id+".events.jsonl"),
		Usage:    schemas.Usage{}, Node: h.cfg.Name,
		Policy:    pol.Record(p.cwd),
		RequestID: req.RequestID,
		Parent:    req.Parent, Depth: req.Depth, Reach: req.Reach,
		SandboxNet: req.SandboxNet,
	}
	if p.sandboxed {
		// Sandboxed from its first record on, as its claim may say: the
		// policy the kernel confines it to comes once it is set up.
		p.rec.Sandbox = &schemas.SandboxPolicy{}
	}
	if ws := req.Workspace; ws != nil {
		p.rec.Workspace = ws
		// Its checkout reads the objects it started from in the cache;
		// it writes its own.
		p.readable = append(p.readable, h.repos.cache.Objects(ws.Repo))
	}
	return p, nil
}

// OpenAgent starts an agent (agent_open) and returns its id once it is
// ready.
func (h *Host) OpenAgent(ctx context.Context, req schemas.OpenRequest) (rep schemas.OpenReply, err error) {
	if req.ID != "" && schemas.ValidID(req.ID) == nil {
		// A close from now on ends the open, whatever step it is at: an
		// agent on a repository is not the node's until its checkout is
		// made, and a close meanwhile found no agent and the agent came
		// up after it.
		var end func()
		if ctx, end, err = h.beginOpen(ctx, req.ID); err != nil {
			return rep, err
		}
		defer end()
		defer func() {
			if err != nil && errors.Is(context.Cause(ctx), errClosedAsStarted) {
				err = schemas.Errf(schemas.CodeUnavailable, "agent %s was closed as it started", req.ID)
			}
		}()
	}
	if req.Workspace != nil {
		// On a repository: the agent works in a checkout of its own, made
		// here (or kept from its previous life), which an open that
		// fails takes away again.
		if req.ID == "" {
			return rep, schemas.Errf(schemas.CodeInvalid, "an open on a repository names its agent")
		}
		if err := schemas.ValidID(req.ID); err != nil {
			return rep, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
		}
		ws := *req.Workspace
		var dir string
		var made bool
		if dir, made, err = h.repos.prepare(ctx, req.ID, &ws); err != nil {
			return rep, err
		}
		if made {
			defer func() {
				if err != nil {
					h.repos.undo(req.ID)
				}
			}()
		}
		req.Workspace, req.CWD = &ws, dir
	}
	if err := h.within(&req); err != nil {
		return rep, err
	}
	h.refreshGrant(ctx)
	p, err := h.planOpen(req)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	a, err := h.reserve(p)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	release, err := h.claimAndResume(ctx, a)
	if err != nil {
		h.unreserve(a)
		close(a.done) // its loop never ran: a close waiting for its end ends
		return schemas.OpenReply{}, err
	}
	// An open that fails here leaves nothing: the caller has the error,
	// the claim is given back (an id with no past has no record), and the
	// stream holds nothing of it.
	if err := h.start(ctx, a, p, req.SandboxNet); err != nil {
		h.abortOpen(ctx, a, release)
		return schemas.OpenReply{}, err
	}
	h.recs.mark(a, true)
	// Placement reads the node's load from its record: it is current before
	// the reply goes out.
	if err := h.ads.write(ctx); err != nil {
		h.ads.poke()
	}
	a.log.Info("agent opened", "model", p.model, "cwd", p.cwd)
	return schemas.OpenReply{AgentID: p.id, Node: h.cfg.Name}, nil
}

// opening is an open of an agent under way on this node, from its request
// to its reply.
type opening struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// errClosedAsStarted is why an open a close ended stopped.
var errClosedAsStarted = errors.New("the agent was closed as it started")

// beginOpen counts an open of id under way, whose steps run within the
// returned context, until end is called; it refuses a second open of id
// while one is (a retry of the same request is answered by the first).
func (h *Host) beginOpen(ctx context.Context, id string) (_ context.Context, end func(), _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.opening[id]; ok {
		return ctx, nil, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (an open of it is under way on node %s)", id, h.cfg.Name)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	o := &opening{cancel: cancel, done: make(chan struct{})}
	h.opening[id] = o
	return ctx, func() {
		h.mu.Lock()
		delete(h.opening, id)
		h.mu.Unlock()
		cancel(nil)
		close(o.done)
	}, nil
}

// isOpening reports whether an open of id is under way.
func (h *Host) isOpening(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opening[id] != nil
}

// stopOpening ends the open of id under way, if one is, and waits until
// it has (its claim given back, its checkout taken away) or ctx ends.
func (h *Host) stopOpening(ctx context.Context, id string) {
	h.mu.Lock()
	o := h.opening[id]
	h.mu.Unlock()
	if o == nil {
		return
	}
	o.cancel(errClosedAsStarted)
	select {
	case <-o.done:
	case <-ctx.Done():
	}
}

// reserve takes the id on this node for the plan's agent, within the
// node's limit. The limit is checked and the id reserved under one lock,
// so concurrent opens cannot all see room for themselves; an agent still
// starting holds its slot.
func (h *Host) reserve(p openPlan) (*agent, error) {
	if why := h.health(); why != "" {
		return nil, schemas.Errf(schemas.CodeUnavailable, "node %s cannot start agents now: %s", h.cfg.Name, why)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if max := h.cfg.MaxAgents; max > 0 && h.liveAgentsLocked() >= max {
		return nil, schemas.Errf(schemas.CodeUnavailable, "node %s is full (%d of %d agents)", h.cfg.Name, max, max)
	}
	if old, ok := h.agents[p.id]; ok && !old.isDead() {
		return nil, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s", p.id)
	}
	a := newAgent(h, p.rec)
	a.askTimeout = p.askTimeout
	h.agents[p.id] = a
	return a, nil
}

// unreserve gives back an id the open could not claim.
func (h *Host) unreserve(a *agent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.agents[a.id] == a {
		delete(h.agents, a.id)
	}
}

// claimAndResume takes up the record the coordinator claimed for the
// agent, then reads where its previous life's stream ended: a reopened id
// goes on with its event and turn numbers. Without its stream's end the
// agent cannot number an event, and the claim is given back.
func (h *Host) claimAndResume(ctx context.Context, a *agent) (release func(context.Context), err error) {
	release, err = h.recs.claim(ctx, a)
	if err != nil {
		return nil, err
	}
	tails, err := h.tails(ctx, []string{a.id})
	if err != nil {
		release(context.WithoutCancel(ctx))
		return nil, schemas.Errf(schemas.CodeUnavailable, "read the agent's last event: %v", err)
	}
	a.resume(tails[a.id])
	return release, nil
}

// abortOpen undoes an open whose agent did not start: what its start set
// up (its sandbox's proxy, its files), its claim, its place on the node.
func (h *Host) abortOpen(ctx context.Context, a *agent, release func(context.Context)) {
	a.mu.Lock()
	a.sess, a.dead, a.muted = noSession{}, true, true
	a.rec.Status = schemas.StatusDead
	a.mu.Unlock()
	close(a.done) // its loop never ran
	a.ended()
	a.closeFiles()
	if life := h.pids.remove(a.id); life != "" {
		proc.ReapLife(life)
	}
	release(context.WithoutCancel(ctx))
	h.unreserve(a)
	h.ads.poke()
}

// start opens the agent's files, confines it when it runs sandboxed, and
// starts its backend within the node's open timeout.
func (h *Host) start(ctx context.Context, a *agent, p openPlan, net []string) error {
	stderr, err := a.openFiles(filepath.Join(h.cfg.Dir, a.id+".log"))
	if err != nil {
		return schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	// Every process of this life of the agent carries its token, so a
	// restarted node finds what a crash left, wherever it went.
	life := proc.NewLifeToken()
	spec := p.spec
	spec.Env = append(append([]string(nil), h.cfg.Env...), "SHOAL_AGENT_ID="+a.id, "SHOAL_NODE="+h.cfg.Name,
		"SHOAL_PARENT_PID="+strconv.Itoa(os.Getpid()), proc.LifeEnv+"="+life)
	spec.Stderr, spec.Reaper, spec.Logger = stderr, h.currentReaper(), a.log
	a.mu.Lock()
	a.reaper = spec.Reaper
	a.mu.Unlock()
	if spec.Policy.Ask {
		spec.Asker = a
	}
	if p.sandboxed {
		// Confined before it starts: the sandbox's one stage (the
		// wrapper, or the namespaces' init) restricts itself before it
		// starts the CLI, and everything after inherits it.
		c, err := h.confine(ctx, p.be, spec, net, p.readable...)
		if err != nil {
			return err
		}
		a.atEnd(c.end)
		spec.Sandbox = c.conf
		spec.Env = append(spec.Env, c.env...)
		spec.MCP.URL = c.mcpURL
		a.sandboxed(c.policy)
	}
	if p.rec.Workspace != nil {
		// On a repository, it commits as itself, not as whoever its
		// node's environment names.
		spec.Env = append(spec.Env, identityEnv(a.id)...)
		if spec.Sandbox != nil {
			spec.Sandbox.Env = append(spec.Sandbox.Env, identityVars...)
		}
	}
	// The life's token is written down before anything of it runs: a
	// node (and its reaper) killed while the agent starts (an ACP
	// handshake takes seconds, its servers started meanwhile) leaves
	// processes its restart finds by it. abortOpen forgets it.
	if err := h.pids.add(a.id, 0, life); err != nil {
		a.log.Warn("cannot record the agent's life", "err", err)
	}
	startCtx, cancel := context.WithTimeout(ctx, h.cfg.OpenTimeout)
	defer cancel()
	a.mu.Lock()
	closed := a.closing
	a.stopStart = cancel
	a.mu.Unlock()
	if closed {
		cancel() // closed as it was reserved: it starts no more
	}
	service.LongWait(ctx) // an agent may take a while to start (an ACP handshake)
	sess, err := p.be.Start(startCtx, spec, a)
	if r := spec.Reaper; err != nil && r != nil && (errors.Is(err, proc.ErrReaperGone) || r.Gone()) {
		return schemas.Errf(schemas.CodeUnavailable, "node %s cannot start agents now: its reaper died as the agent started, and another is starting", h.cfg.Name)
	}
	if err != nil {
		code := schemas.CodeInvalid
		_, launch := errors.AsType[*proc.LaunchError](err)
		_, unreachable := errors.AsType[*backend.UnreachableError](err)
		a.mu.Lock()
		closed := a.closing
		a.mu.Unlock()
		switch {
		case closed:
			return schemas.Errf(schemas.CodeUnavailable, "agent %s was closed as it started", a.id)
		case startCtx.Err() != nil:
			return schemas.Errf(schemas.CodeTimeout, "agent %s did not start within %s: %v", a.id, h.cfg.OpenTimeout, err)
		case launch:
			code = schemas.CodeUnavailable // this node cannot run it
		case unreachable:
			code = schemas.CodeUnavailable // a server it needs is not there for it now
		}
		return schemas.Errf(code, "%v", err)
	}
	if err := h.pids.add(a.id, sess.Info().PID, life); err != nil {
		a.log.Warn("cannot record the agent's pid", "err", err)
	}
	a.started(ctx, sess)
	return nil
}
