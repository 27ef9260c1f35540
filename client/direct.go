package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// Direct is a client with the coordinator's rights: it reads records and
// the stream itself, places agents on nodes, and sends each request about
// an agent to the node that owns it. The coordinator's own services and
// the command line with full credentials use it.
type Direct struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	timeout   time.Duration
	progress  func(string)
	maxBundle int64

	mu    sync.Mutex
	cache *nodeCache
	// permits is the view of the requests waiting (WatchPermits).
	permits *permitView
	agents  jetstream.KeyValue // opened once
	nodes   jetstream.KeyValue
	stream  jetstream.Stream
}

// NewDirect returns a direct client on nc.
func NewDirect(nc *nats.Conn, cfg Config) (*Direct, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	maxBundle := cfg.MaxBundle
	if maxBundle <= 0 {
		maxBundle = DefaultMaxBundle
	}
	return &Direct{nc: nc, js: js, timeout: cfg.timeout(), progress: cfg.Progress, maxBundle: maxBundle}, nil
}

// Conn implements Client.
func (f *Direct) Conn() *nats.Conn { return f.nc }

// JetStream is the client's JetStream handle.
func (f *Direct) JetStream() jetstream.JetStream { return f.js }

// bucketErr says that bucket could not be opened, and, where nothing
// answered (the coordinator gone: killed, restarting), that the fabric is
// away rather than the bucket.
func bucketErr(nc *nats.Conn, bucket string, err error) error {
	if !nc.IsConnected() || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return schemas.Errf(schemas.CodeUnavailable, "the fabric does not answer (open KV bucket %s: %v): is shoal up running? Ask again once it is", bucket, err)
	}
	return schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", bucket, err)
}

// agentsKV is the agents bucket, opened once.
func (f *Direct) agentsKV(ctx context.Context) (jetstream.KeyValue, error) {
	f.mu.Lock()
	kv := f.agents
	f.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := f.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return nil, bucketErr(f.nc, schemas.AgentsBucket, err)
	}
	f.mu.Lock()
	f.agents = kv
	f.mu.Unlock()
	return kv, nil
}

// nodesKV is the nodes bucket, opened once.
func (f *Direct) nodesKV(ctx context.Context) (jetstream.KeyValue, error) {
	f.mu.Lock()
	kv := f.nodes
	f.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := f.js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		return nil, bucketErr(f.nc, schemas.NodesBucket, err)
	}
	f.mu.Lock()
	f.nodes = kv
	f.mu.Unlock()
	return kv, nil
}

// events is the stream, opened once.
func (f *Direct) events(ctx context.Context) (jetstream.Stream, error) {
	f.mu.Lock()
	st := f.stream
	f.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := f.js.Stream(ctx, schemas.StreamName)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return nil, schemas.Errf(schemas.CodeUnavailable, "open stream %s: JetStream did not answer in time (the fabric's server away or restarting?): %v", schemas.StreamName, err)
	}
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "open stream %s: %v", schemas.StreamName, err)
	}
	f.mu.Lock()
	f.stream = st
	f.mu.Unlock()
	return st, nil
}

// Open starts an agent on the node req names or, through placement, on
// the least loaded node that can run it.
func (f *Direct) Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	if req.Workspace != nil {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "workspace is Shoal's to set: open on a repository with OpenRepo")
	}
	if req.Repo || req.Ref != "" || req.WithChanges {
		// The repository is on the caller's machine: its own client
		// bundles it (OpenRepo); no service can on its behalf.
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "an open on a repository (repo, ref, with_changes) is made by the caller's own client, on the machine that holds the repository (shoal open --repo, or agent_open at the coordinator's MCP endpoint)")
	}
	return f.open(ctx, req, nil)
}

// open places and opens req; ship, when set, sends the node chosen what
// it needs of a repository and returns the agent's workspace there.
func (f *Direct) open(ctx context.Context, req schemas.OpenRequest, ship func(ctx context.Context, node string) (*schemas.Workspace, error)) (schemas.OpenReply, error) {
	if req.Node != "" {
		if err := schemas.ValidID(req.Node); err != nil {
			return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "node %v", err)
		}
	}
	if req.ID != "" {
		if err := validAgent(req.ID); err != nil {
			return schemas.OpenReply{}, err
		}
	}
	NameOpen(&req)
	if err := schemas.CheckModel(req.Model); err != nil {
		return schemas.OpenReply{}, err
	}
	if err := f.keepSandbox(ctx, &req); err != nil {
		return schemas.OpenReply{}, err
	}
	if err := schemas.CheckBudget(req.BudgetTokens, req.BudgetUSD); err != nil {
		return schemas.OpenReply{}, err
	}
	if req.Parent == "" {
		return f.openBudgeted(ctx, req, ship)
	}
	// A child's open, once begun, goes to its end whether or not its
	// caller waits: what the parent's budget gave and whether the child
	// opened must agree, and an agent giving up its call half-way (a
	// write the server made while the caller saw it cancelled, an open
	// the node took up after its claim was given back) left them not to.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), schemas.OpenTimeout+time.Minute)
	defer cancel()
	undo, err := f.drawOnParent(ctx, &req)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	rep, err := f.openBudgeted(ctx, req, ship)
	if err != nil {
		// What the parent gave goes back to it unless the child may have
		// opened after all.
		if !f.mayHaveOpened(context.WithoutCancel(ctx), req) {
			undo(context.WithoutCancel(ctx))
		}
	}
	return rep, err
}

// openBudgeted is open, once the budget req asks is what it may have:
// set before the node hears of the agent, so that its first turn is held
// to it, and put back as it was if the open fails without the agent
// (a later open of the id, asking for no budget, was held to it).
func (f *Direct) openBudgeted(ctx context.Context, req schemas.OpenRequest, ship func(ctx context.Context, node string) (*schemas.Workspace, error)) (schemas.OpenReply, error) {
	if req.BudgetTokens == 0 && req.BudgetUSD == 0 {
		return f.openPlaced(ctx, req, ship)
	}
	undo, err := f.budgetForOpen(ctx, req)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	rep, err := f.openPlaced(ctx, req, ship)
	if err != nil && !f.mayHaveOpened(context.WithoutCancel(ctx), req) {
		undo(context.WithoutCancel(ctx))
	}
	return rep, err
}

// budgetForOpen sets agent req.ID's budget as req asks; undo puts back
// what it was (none, or another), unless it was changed since.
func (f *Direct) budgetForOpen(ctx context.Context, req schemas.OpenRequest) (undo func(context.Context), err error) {
	kv, err := f.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)
	}
	key := schemas.Scope{Agent: req.ID}.Key()
	prev, had, err := BudgetValue(ctx, kv, key)
	if err != nil {
		return nil, err
	}
	v, _ := json.Marshal(schemas.Budget{Tokens: req.BudgetTokens, USD: req.BudgetUSD})
	rev, err := kv.Put(ctx, key, v)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "set agent %s's budget: %v", req.ID, err)
	}
	return func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if had {
			kv.Update(ctx, key, prev, rev)
		} else {
			kv.Delete(ctx, key, jetstream.LastRevision(rev))
		}
	}, nil
}

// mayHaveOpened reports whether an open that failed may have opened its
// agent after all: a life of it made by this request is there, or its
// record cannot be read.
func (f *Direct) mayHaveOpened(ctx context.Context, req schemas.OpenRequest) bool {
	rec, _, err := f.record(ctx, req.ID)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		return false
	}
	return err != nil || rec.RequestID == req.RequestID
}

// openPlaced opens req's agent on its node, or on the one placement
// chooses.
func (f *Direct) openPlaced(ctx context.Context, req schemas.OpenRequest, ship func(ctx context.Context, node string) (*schemas.Workspace, error)) (schemas.OpenReply, error) {
	// An open placed by the fabric goes to another node when the one
	// chosen cannot take it after all (stopping, gone, full, unable to
	// start agents): placement read the nodes' records a moment before,
	// and a record outlives its node by up to a heartbeat.
	placed := req.Node == ""
	var passed, why []string // the nodes tried and gone on from, and what each said
	for attempt := 0; ; attempt++ {
		nodes, err := f.Nodes(ctx)
		if err != nil {
			return schemas.OpenReply{}, err
		}
		nodes = slices.DeleteFunc(nodes, func(n schemas.NodeRecord) bool { return slices.Contains(passed, n.Name) })
		if ship != nil {
			if err := gitNodes(&nodes, req.Node); err != nil {
				return schemas.OpenReply{}, err
			}
		}
		try := req
		node, err := place(nodes, req)
		if err != nil {
			if placed && attempt < maxPlacements && schemas.CodeOf(err) == schemas.CodeUnavailable {
				// A view of the nodes read as one left may miss the
				// others for a moment: look again.
				if !sleepCtx(ctx, 100*time.Millisecond*time.Duration(attempt+1)) {
					return schemas.OpenReply{}, err
				}
				continue
			}
			switch {
			case len(passed) > 0 && len(nodes) == 0:
				err = schemas.Errf(schemas.CodeUnavailable, "no node can take this agent: %s", strings.Join(why, "; "))
			case len(passed) > 0:
				err = fmt.Errorf("%w (passed over: %s)", err, strings.Join(why, "; "))
			}
			return schemas.OpenReply{}, err
		}
		try.Node = node
		var rep schemas.OpenReply
		if ship != nil {
			if try.Workspace, err = ship(ctx, node); err == nil {
				// Where its node will check it out, on which branch: the
				// claim says so while the agent starts.
				try.Workspace.Dir = checkoutOn(nodes, node, try.ID)
				try.Workspace.Branch = schemas.BranchName(try.ID)
			}
		}
		if err == nil {
			rep, err = f.openOn(ctx, try, passed)
		}
		if _, everywhere := errors.AsType[anyNode](err); everywhere || err == nil || !placed || attempt >= maxPlacements || schemas.CodeOf(err) != schemas.CodeUnavailable || ctx.Err() != nil {
			return rep, err
		}
		passed = append(passed, node)
		said := err.Error()
		if !strings.Contains(said, "node "+node) {
			said = "node " + node + ": " + said // each reason names the node it is of
		}
		why = append(why, said)
	}
}

// keepSandbox makes the reopen of an id whose last life was sandboxed
// sandboxed too, of the same kind, with the same hosts, unless req says
// whether it wants a sandbox: what the agent wrote in its directory (a
// git hook, an fsmonitor the CLI's first git status runs) would otherwise
// run unconfined as its next life starts, with nobody asked.
func (f *Direct) keepSandbox(ctx context.Context, req *schemas.OpenRequest) error {
	if req.ID == "" || req.Sandbox != nil || req.SandboxKind != "" {
		return nil
	}
	rec, _, err := f.record(ctx, req.ID)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		// Its node may have forgotten the record of a life that ended:
		// the stream still says how it ran.
		rec, err = f.recordFromStream(ctx, req.ID)
	}
	switch {
	case schemas.CodeOf(err) == schemas.CodeNotFound:
		return nil
	case err != nil:
		return err
	case rec.Sandbox == nil:
		return nil
	}
	yes := true
	req.Sandbox = &yes
	if schemas.SandboxGives(rec.Sandbox.Kernel, schemas.SandboxNamespaces) {
		req.SandboxKind = schemas.SandboxNamespaces
	}
	if req.SandboxNet == nil {
		req.SandboxNet = rec.SandboxNet
	}
	return nil
}

// maxPlacements bounds how many times an open placed by the fabric goes
// to another node.
const maxPlacements = 4

// sleepCtx waits d, reporting false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// openOn claims the agent for req.Node and asks that node to open it.
func (f *Direct) openOn(ctx context.Context, req schemas.OpenRequest, passed []string) (schemas.OpenReply, error) {
	node := req.Node
	// The id is claimed for the node before the node hears of it: a node
	// writes only the records that name it (the relay holds confined nodes
	// to that), so ownership is given here, not taken.
	release, err := f.claim(ctx, req, passed)
	if err != nil {
		if schemas.CodeOf(err) == schemas.CodeConflict {
			if rec, ok := f.sameOpen(ctx, req); ok {
				return schemas.OpenReply{AgentID: rec.ID, Node: rec.Node}, nil // a retry of an open that went through
			}
		}
		return schemas.OpenReply{}, err
	}
	var rep schemas.OpenReply
	// A node that dies while it opens never answers: its entry in
	// shoal_nodes going (or naming another instance) ends the wait, not
	// the open's timeout of minutes.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := f.watchNode(wctx, node)
	answered := make(chan error, 1)
	go func() {
		answered <- f.request(wctx, node, schemas.VerbOpen, req, &rep, schemas.OpenTimeout+10*time.Second)
	}()
	// An open that takes long (a coordinator away as the node asks it,
	// a slow agent) says so, rather than leaving its caller in silence.
	stopTicking := f.waitingFor(fmt.Sprintf("node %s to start agent %s", node, req.ID), false)
	defer stopTicking()
	select {
	case err = <-answered:
	case why := <-lost:
		select {
		case err = <-answered:
		case <-time.After(lossGrace):
			cancel()
			<-answered
			rep, err = schemas.OpenReply{}, schemas.Errf(schemas.CodeUnavailable, "node %s %s while it opened agent %s", node, why, req.ID)
		}
	}
	if err != nil && release != nil {
		// Given back unless the node took it up: the node's own wait for
		// an open is as long as this one's, so one that did not answer in
		// time takes it up no more. (A child's open is not cut short by
		// its caller: see Open.)
		release(context.WithoutCancel(ctx))
	}
	return rep, err
}

// watchNode reports, once, what became of node when its entry in
// shoal_nodes goes (it stopped, or its heartbeat lapsed) or names another
// instance (it restarted) while it is watched, until ctx ends.
func (f *Direct) watchNode(ctx context.Context, node string) <-chan string {
	f.mu.Lock()
	c := f.cache
	f.mu.Unlock()
	if c != nil {
		// A client that follows the nodes already: one watch serves
		// every open.
		lost, stop := c.watch(node)
		context.AfterFunc(ctx, stop)
		return lost
	}
	lost := make(chan string, 1)
	kv, err := f.nodesKV(ctx)
	if err != nil {
		return lost // the node's answer, or the timeout, ends the wait
	}
	w, err := WatchKeys(ctx, f.nc, kv, node)
	if err != nil {
		return lost
	}
	go func() {
		defer w.Stop()
		instance := ""
		for e := range w.Updates() {
			if e == nil {
				continue // the initial value is in
			}
			if e.Operation() != jetstream.KeyValuePut {
				lost <- "was lost or stopped"
				return
			}
			var rec schemas.NodeRecord
			if json.Unmarshal(e.Value(), &rec) != nil {
				continue
			}
			if instance == "" {
				instance = rec.Instance
			} else if rec.Instance != instance {
				lost <- "restarted"
				return
			}
		}
	}()
	return lost
}

// sameOpen reports whether agent req.ID is the one this request opened,
// and its record: a retry of an open that went through. While that open
// is still under way on its node (the record says starting) it waits for
// the outcome, up to the open's time.
func (f *Direct) sameOpen(ctx context.Context, req schemas.OpenRequest) (schemas.AgentRecord, bool) {
	deadline := time.Now().Add(schemas.OpenTimeout + 10*time.Second)
	for {
		rec, _, err := f.record(ctx, req.ID)
		switch {
		case err != nil || rec.RequestID != req.RequestID || rec.Status == schemas.StatusDead:
			return rec, false
		case rec.Status != schemas.StatusStarting:
			return rec, true
		case time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond):
			return rec, false
		}
	}
}

// claim gives agent req.ID to node req.Node: its record, created or
// written over a dead one, names the node and the request, status
// starting, which the node takes up. A record this request claimed before
// (a retry) is left as it is. The release gives the claim up if the node
// never took it up: a node that answered with an error, or could not be
// reached, left the record as claimed.
//
// passed names nodes this open was sent to and went on from: a claim of
// this request they left, still starting, is taken over.
func (f *Direct) claim(ctx context.Context, req schemas.OpenRequest, passed []string) (release func(context.Context), err error) {
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return nil, err
	}
	now := unixSeconds(time.Now())
	model := req.Model
	if model == "" {
		model = schemas.DefaultModel
	}
	claimed := schemas.AgentRecord{ID: req.ID, Status: schemas.StatusStarting, Model: model, CWD: req.CWD,
		CreatedAt: now, LastActivity: now, Usage: schemas.Usage{}, Node: req.Node, RequestID: req.RequestID,
		Parent: req.Parent, Depth: req.Depth, Reach: req.Reach, Workspace: req.Workspace, SandboxNet: req.SandboxNet}
	// What the rights rules read of the record is the coordinator's to
	// say, not the node's: the policy composed from the request, as the
	// node will compose it, a sandbox the open asked for, and the
	// repository and bundle an agent on one is opened from (what its node
	// may read of the object store). The relay holds a confined node's
	// writes to them.
	if pol, err := schemas.ComposePolicy(req.Permission, req.PermissionMode, req.AllowedTools, req.DisallowedTools, req.Only); err == nil {
		pol.Ask = pol.Ask || req.Ask
		cwd := req.CWD
		if req.Workspace != nil && req.Workspace.Dir != "" {
			cwd = req.Workspace.Dir // where the agent will work
		}
		claimed.Policy = pol.Record(cwd)
	}
	if req.Sandbox != nil && *req.Sandbox {
		claimed.Sandbox = &schemas.SandboxPolicy{}
	}
	grant, _ := json.Marshal(claimed)
	var prev []byte
	var rev uint64
	var waited time.Duration
	// A record that changes between the read and the write (a node giving
	// back a claim it could not use) is read again.
	for try := 0; ; try++ {
		prev = nil
		rev, err = kv.Create(ctx, req.ID, grant)
		if !errors.Is(err, jetstream.ErrKeyExists) {
			break
		}
		e, gerr := kv.Get(ctx, req.ID)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) && try < 3 {
			continue // deleted since: create it
		}
		if gerr != nil {
			return nil, schemas.Errf(schemas.CodeUnavailable, "read agent %s: %v", req.ID, gerr)
		}
		prev = e.Value()
		var old schemas.AgentRecord
		next := grant
		if json.Unmarshal(e.Value(), &old) == nil {
			switch {
			case old.RequestID == req.RequestID && old.Status != schemas.StatusDead && old.Node == req.Node:
				return nil, nil // this request's own claim: a retry
			case old.RequestID == req.RequestID && old.Status == schemas.StatusStarting && slices.Contains(passed, old.Node):
				prev = nil // left by a node this open went on from: nothing to give back
			case old.Status != schemas.StatusDead && !staleClaim(old):
				return nil, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s", req.ID) // Kaimon's words
			case old.Closing != nil:
				// The coordinator is storing its last life's close (its
				// node was lost): stored after a new life began, its
				// events would end the stream inside that life. It is
				// waited for, a moment as a rule.
				if waited >= closingWait {
					return nil, schemas.Errf(schemas.CodeUnavailable, "agent %s: the coordinator has not finished closing its last life (its node was lost) in %s; open it again once it has", req.ID, closingWait)
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(closingPoll):
				}
				waited += closingPoll
				try = -1 // not a try lost to a node's write
				continue
			}
			// A new life of the id carries what its lives so far used
			// (a claim never taken up carries what it was given).
			c := claimed
			c.UsageBefore = old.NextLife()
			c.EventsBefore, c.TurnsBefore = old.NextNumbers()
			next, _ = json.Marshal(c)
		}
		rev, err = kv.Update(ctx, req.ID, next, e.Revision())
		if err == nil || try >= 3 {
			break
		}
	}
	if err != nil {
		return nil, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (its record changed while opening: %v)", req.ID, err)
	}
	return func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if e, err := kv.Get(ctx, req.ID); err != nil || e.Revision() != rev {
			return // the node took it up: what became of it is the node's to say
		}
		if prev == nil {
			Forget(ctx, f.js, req.ID, nil, rev)
		} else {
			kv.Update(ctx, req.ID, prev, rev)
		}
	}, nil
}

// closingWait is how long an open waits for the close of the id's last
// life to be stored; closingPoll how often it looks.
const (
	closingWait = 10 * time.Second
	closingPoll = 100 * time.Millisecond
)

// staleClaim reports whether a record is a claim its node never took up:
// still starting well after any open would have ended.
func staleClaim(rec schemas.AgentRecord) bool {
	return rec.Status == schemas.StatusStarting && time.Since(time.Unix(int64(rec.CreatedAt), 0)) > schemas.OpenTimeout+time.Minute
}

// NameOpen gives an open request the request id and the agent id it
// will open under, when the caller chose none: a request id of its own,
// and an id derived from the request id, so that a retry of the request
// names the same agent wherever placement sends it and finds the agent
// the first attempt opened. A door that judges whether its caller may
// open that id names the request first: the id is the request id's, and
// the caller chooses that.
func NameOpen(req *schemas.OpenRequest) {
	req.RequestID = requestID(req.RequestID)
	if req.ID == "" {
		req.ID = derivedID(req.RequestID)
	}
}

// derivedID is the agent id an open request names when the caller chose
// none: 8 hex characters of a hash of its request id.
func derivedID(requestID string) string {
	sum := sha256.Sum256([]byte("shoal-open/" + requestID))
	return hex.EncodeToString(sum[:4])
}

// Send writes a user turn to an agent.
func (f *Direct) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SendReply
	return rep, f.toOwner(ctx, req.AgentID, schemas.VerbSend, req, &rep, 0)
}

// Run sends a turn and waits for its end. It watches the agent's record
// while it waits, not only its node: a node that dies or restarts during
// the turn never answers, and the fabric marks its agents dead within
// the node heartbeat's lifetime, which ends the wait as unavailable.
func (f *Direct) Run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	// The id names subjects the watch below subscribes to: it is checked
	// before anything is asked of the server.
	if err := validAgent(req.AgentID); err != nil {
		return schemas.RunReply{}, err
	}
	timeout, err := schemas.RunTimeout(req.Timeout)
	if err != nil {
		return schemas.RunReply{}, err
	}
	req.RequestID = requestID(req.RequestID)
	var rep schemas.RunReply
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := f.watchLoss(ctx, req.AgentID)
	answered := make(chan error, 1)
	go func() { answered <- f.toOwner(ctx, req.AgentID, schemas.VerbRun, req, &rep, timeout+30*time.Second) }()
	select {
	case err := <-answered:
		return rep, err
	case why := <-lost:
		// An agent that died on a live node is answered by its node at
		// once, with what became of the turn; give that a moment.
		select {
		case err := <-answered:
			return rep, err
		case <-time.After(lossGrace):
		}
		return schemas.RunReply{}, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead: %s", req.AgentID, why)
	}
}

// lossGrace is how long a run whose agent's record turned dead waits for
// its node's own answer.
const lossGrace = 2 * time.Second

// watchLoss says, once, what became of the node of an agent whose record
// turns dead (or is taken by another life) while it is watched, until ctx
// ends: lost, as the coordinator judged it (its close names it), or
// restarted, closing what it left (it closes in its own name); before the
// turn ended, which it may not have begun.
func (f *Direct) watchLoss(ctx context.Context, id string) <-chan string {
	lost := make(chan string, 1)
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return lost // the node's answer, or the timeout, ends the run
	}
	w, err := WatchKeys(ctx, f.nc, kv, id)
	if err != nil {
		return lost
	}
	go func() {
		defer w.Stop()
		var first *schemas.AgentRecord
		for e := range w.Updates() {
			if e == nil {
				continue // the initial values are in
			}
			var rec schemas.AgentRecord
			if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &rec) != nil {
				continue
			}
			if first == nil {
				first = &rec
			}
			if rec.Status == schemas.StatusDead || rec.CreatedAt != first.CreatedAt {
				how := "restarted"
				if rec.ClosedBy != "" || rec.Status != schemas.StatusDead {
					how = "was lost"
				}
				lost <- fmt.Sprintf("its node %s %s before the turn ended", first.Node, how)
				return
			}
		}
	}()
	return lost
}

// Status returns an agent's record from its node, or from KV when the
// node does not answer or no longer keeps the agent.
func (f *Direct) Status(ctx context.Context, id string) (schemas.AgentRecord, error) {
	switch rec, _, err := f.record(ctx, id); {
	case err == nil && rec.Status == schemas.StatusDead:
		return rec, nil // its record has the last word
	case schemas.CodeOf(err) == schemas.CodeNotFound:
		return f.recordFromStream(ctx, id) // pruned, or never opened
	}
	var rep schemas.AgentRecord
	err := f.toOwner(ctx, id, schemas.VerbStatus, schemas.AgentRequest{AgentID: id}, &rep, 0)
	switch code := schemas.CodeOf(err); {
	case err == nil:
		return rep, nil
	case code == schemas.CodeUnavailable, code == schemas.CodeNotFound, code == schemas.CodeTimeout:
		// The owner is gone, or restarted and no longer keeps the agent:
		// its record has the last word.
		if rec, _, kerr := f.record(ctx, id); kerr == nil {
			return rec, nil
		}
	}
	return rep, err
}

// Interrupt cancels an agent's running turn.
func (f *Direct) Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	var rep schemas.InterruptReply
	req.RequestID = requestID(req.RequestID)
	id := req.AgentID
	return rep, f.toOwner(ctx, id, schemas.VerbInterrupt, req, &rep, 0)
}

// Close stops an agent; an unknown id answers closed false.
func (f *Direct) Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	var rep schemas.CloseReply
	req.RequestID = requestID(req.RequestID)
	id := req.AgentID
	err := f.toOwner(ctx, id, schemas.VerbClose, req, &rep, 0)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		return schemas.CloseReply{Closed: false}, nil
	}
	if err == nil && !rep.Closed {
		// The node runs no such agent. A claim no node took up (its
		// caller went before the node heard of it), long past any open,
		// said starting for good: the close ends it.
		if rec, rev, rerr := f.record(ctx, id); rerr == nil && staleClaim(rec) && rec.EventLog == "" {
			if err := EndClaim(ctx, f.js, rec, rev); err != nil {
				return rep, schemas.Errf(schemas.CodeUnavailable, "agent %s: its open never finished, and its claim could not be given up: %v", id, err)
			}
			return schemas.CloseReply{Closed: true}, nil
		}
	}
	return rep, err
}

// SetModel repoints an agent at another model.
func (f *Direct) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SetModelReply
	err := f.toOwner(ctx, req.AgentID, schemas.VerbSetModel, req, &rep, 0)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		return schemas.SetModelReply{Reason: fmt.Sprintf("no agent '%s'", req.AgentID)}, nil
	}
	return rep, err
}

// SortByCreation puts recs in the order the agents were made, ids breaking
// ties: the order every list of the agents shows.
func SortByCreation(recs []schemas.AgentRecord) {
	slices.SortFunc(recs, func(a, b schemas.AgentRecord) int {
		if a.CreatedAt != b.CreatedAt {
			if a.CreatedAt < b.CreatedAt {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// List returns every agent record in the fabric, dead ones included,
// oldest first.
func (f *Direct) List(ctx context.Context) ([]schemas.AgentRecord, error) {
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return nil, err
	}
	service.LongWait(ctx) // every record
	recs := []schemas.AgentRecord{}
	if err := eachValue(ctx, kv, func(_ string, v []byte) {
		var rec schemas.AgentRecord
		if json.Unmarshal(v, &rec) == nil {
			recs = append(recs, rec)
		}
	}); err != nil {
		return nil, err
	}
	SortByCreation(recs)
	return recs, nil
}

// Record reads an agent's record from KV, with its revision.
// Record implements Client.
func (f *Direct) Record(ctx context.Context, id string) (schemas.AgentRecord, error) {
	rec, _, err := f.record(ctx, id)
	return rec, err
}

// validAgent checks an agent id before any subject is built from it.
func validAgent(id string) error {
	if err := schemas.ValidID(id); err != nil {
		return schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	return nil
}

// record is Record with the record's revision.
func (f *Direct) record(ctx context.Context, id string) (schemas.AgentRecord, uint64, error) {
	rec, rev, _, err := f.recordEntry(ctx, id)
	return rec, rev, err
}

// recordWritten is agent id's record and when the bucket stored it.
func (f *Direct) recordWritten(ctx context.Context, id string) (schemas.AgentRecord, time.Time, error) {
	rec, _, written, err := f.recordEntry(ctx, id)
	return rec, written, err
}

// recordEntry is agent id's record, its revision and when it was stored.
func (f *Direct) recordEntry(ctx context.Context, id string) (schemas.AgentRecord, uint64, time.Time, error) {
	if err := validAgent(id); err != nil {
		return schemas.AgentRecord{}, 0, time.Time{}, err
	}
	kv, err := f.agentsKV(ctx)
	if err != nil {
		return schemas.AgentRecord{}, 0, time.Time{}, err
	}
	e, err := kv.Get(ctx, id)
	// A read whose request or answer was lost with the link (JetStream's
	// own timeout, the caller's time not up) is read again: the link may
	// be back, and a read asked twice is the same read.
	for i := 1; i < recordReads && ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)); i++ {
		e, err = kv.Get(ctx, id)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.AgentRecord{}, 0, time.Time{}, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
	}
	if err != nil {
		return schemas.AgentRecord{}, 0, time.Time{}, schemas.Errf(schemas.CodeUnavailable, "read agent %s: %v", id, err)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return schemas.AgentRecord{}, 0, time.Time{}, schemas.Errf(schemas.CodeInternal, "agent %s has a malformed record: %v", id, err)
	}
	return rec, e.Revision(), e.Created(), nil
}

// recordReads is how many times recordEntry asks for a record whose
// answer does not come.
const recordReads = 3

// toOwner sends a request about an agent to the node that owns it. An
// agent whose record says dead is answered without asking a node that
// may be gone (or restarted, and no longer keeping it), as its node
// answers for a dead agent it keeps: a turn is refused, an interrupt
// interrupts nothing, a close finds it closed.
func (f *Direct) toOwner(ctx context.Context, id string, verb schemas.Verb, req, rep any, timeout time.Duration) error {
	for again := true; ; again = false {
		rec, _, err := f.record(ctx, id)
		if err != nil {
			return err
		}
		if dead, err := deadAnswer(id, rec, verb, rep); dead {
			return err
		}
		err = f.request(ctx, rec.Node, verb, req, rep, timeout)
		if schemas.CodeOf(err) != schemas.CodeNotFound || !strings.Contains(err.Error(), "no such agent: "+id) {
			return err
		}
		// The node runs no such agent: it restarted, and marks dead what
		// its last run left, perhaps since the record was read. The record
		// read again says; a node that still does not know it is away.
		if !again && staleClaim(rec) {
			// An open's claim that no node took up (its caller went before
			// the node heard of it), long past any open: the agent never
			// lived (a close ends the claim: Close).
			return schemas.Errf(schemas.CodeUnavailable, "agent %s never started: its open on node %s never finished; close it, or open the id again", id, rec.Node)
		}
		if !again {
			return schemas.Errf(schemas.CodeUnavailable, "node %s runs no agent %s though its record names it (the node restarted, and is closing what it left?): try again in a moment", rec.Node, id)
		}
	}
}

// deadAnswer answers verb of agent id, whose record is rec, when rec says
// dead, as the node would have: true when it did.
func deadAnswer(id string, rec schemas.AgentRecord, verb schemas.Verb, rep any) (bool, error) {
	if rec.Status == schemas.StatusDead {
		switch r := rep.(type) {
		case *schemas.InterruptReply:
			*r = schemas.InterruptReply{Interrupted: false}
			return true, nil
		case *schemas.CloseReply:
			*r = schemas.CloseReply{Closed: true}
			return true, nil
		case *schemas.SetModelReply:
			*r = schemas.SetModelReply{Reason: fmt.Sprintf("agent '%s' is dead", id)}
			return true, nil
		}
		if verb == schemas.VerbSend || verb == schemas.VerbRun {
			return true, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead", id)
		}
	}
	return false, nil
}

// request sends one control request to a node and decodes its reply. A
// request that carries a request id is sent again, under the same id,
// when its reply is lost or the node is briefly away: the node answers a
// retry with its first reply, so a retried request never acts twice.
func (f *Direct) request(ctx context.Context, node string, verb schemas.Verb, req, rep any, timeout time.Duration) error {
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
	// A node may take a while: to start an agent, end a turn, stop one;
	// or it may hang, and any request waits out its timeout.
	service.LongWait(ctx)
	if verb == schemas.VerbWork || verb == schemas.VerbDiff {
		// A node bundling an agent's work may take minutes, and one
		// lost meanwhile would leave the caller waiting out all of them.
		return f.whileNodeLives(ctx, node, verb, func(ctx context.Context) error { return f.ask(ctx, node, verb, body, rep) })
	}
	return f.ask(ctx, node, verb, body, rep)
}

// whileNodeLives runs ask, a request to node, and fails it as soon as the
// node is lost, stops or restarts (its heartbeat's entry goes, or another
// life of it beats).
func (f *Direct) whileNodeLives(ctx context.Context, node string, verb schemas.Verb, ask func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reconnects := f.nc.Stats().Reconnects
	lost := f.watchNode(ctx, node)
	answered := make(chan error, 1)
	go func() { answered <- ask(ctx) }()
	select {
	case err := <-answered:
		return err
	case how := <-lost:
		cancel()
		<-answered
		if f.nc.Stats().Reconnects != reconnects {
			// The fabric itself was away meanwhile (a coordinator
			// restarted): the node's entry may have gone with it.
			return schemas.Errf(schemas.CodeUnavailable, "the fabric was away while node %s answered %s (the coordinator restarted, or the link to it went): ask again", node, verb)
		}
		return schemas.Errf(schemas.CodeUnavailable, "node %s %s while it answered %s: ask again once it is back", node, how, verb)
	}
}

// ask sends body to node as a request of verb and decodes its reply.
func (f *Direct) ask(ctx context.Context, node string, verb schemas.Verb, body []byte, rep any) error {
	var err error
	attempts, attempt := 1, ctx
	if retryable(verb) {
		attempts = 3
	}
	var msg *nats.Msg
	for i := range attempts {
		if attempts > 1 && verb != schemas.VerbRun {
			deadline, _ := ctx.Deadline()
			var cancel context.CancelFunc
			attempt, cancel = context.WithTimeout(ctx, time.Until(deadline)/time.Duration(attempts-i))
			defer cancel()
		}
		if askedAcross(verb) {
			msg, err = requestNodeAcross(attempt, f.nc, node, schemas.ControlSubject(node, verb), body)
		} else {
			msg, err = RequestNode(attempt, f.nc, node, schemas.ControlSubject(node, verb), body)
		}
		if err == nil || ctx.Err() != nil || i == attempts-1 {
			break
		}
		if errors.Is(err, nats.ErrNoResponders) {
			if i > 0 {
				break // away twice: not a blip
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		} else if !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		// No retry takes it: a wrong request, not an absent fabric.
		return schemas.Errf(schemas.CodeInvalid, "the %s request is %d bytes, more than the %d a message of this fabric may hold (shoal up --max-payload)", verb, len(body), f.nc.MaxPayload())
	case errors.Is(err, nats.ErrNoResponders):
		return schemas.Errf(schemas.CodeUnavailable, "node %s is not reachable", node)
	case errors.Is(err, context.DeadlineExceeded):
		return schemas.Errf(schemas.CodeTimeout, "node %s did not answer %s in time", node, verb)
	case errors.Is(err, context.Canceled):
		// The caller stopped waiting: the node was not found wanting.
		return fmt.Errorf("%s request to node %s: %w", verb, node, err)
	case errors.Is(err, nats.ErrConnectionClosed):
		return schemas.Errf(schemas.CodeUnavailable, "%s request to node %s: the connection to the fabric closed, the fabric away longer than this client tries to reconnect; what the agent did meanwhile is in its stream (shoal output, shoal tail)", verb, node)
	case err != nil:
		return schemas.Errf(schemas.CodeUnavailable, "%s request to node %s: %v", verb, node, err)
	}
	return schemas.DecodeReply(msg.Data, rep)
}

// RequestNode sends a request to one of node's subjects with a reply
// subject under schemas.NodeReplyPrefix(node), where the node's
// credentials let it answer even from behind a leaf connection.
func RequestNode(ctx context.Context, nc *nats.Conn, node, subject string, body []byte) (*nats.Msg, error) {
	inbox := nc.NewInbox()
	reply := schemas.NodeReplyPrefix(node) + inbox[strings.LastIndexByte(inbox, '.'):]
	m, err := requestOnce(ctx, nc, &nats.Msg{Subject: subject, Reply: reply, Data: body})
	if err != nil {
		return nil, err
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return m, nil
}

// requestOnce publishes m and returns the first message that comes to its
// reply subject, subscribed to before; a connection closed meanwhile ends
// the wait with nats.ErrConnectionClosed. The reply waits on a channel of
// a few messages: a sync subscription's channel is as long as nats.go's
// SubChanLen, 65,536 messages (512 KiB), made for every request and held
// as long as it waits, and a coordinator holding 2,000 sends for a node
// that answered nothing (its process stopped) held 1 GiB of them. More
// messages than the channel takes (a flood at the reply subject) are
// dropped, not held.
func requestOnce(ctx context.Context, nc *nats.Conn, m *nats.Msg) (*nats.Msg, error) {
	closed := nc.StatusChanged(nats.CLOSED)
	defer nc.RemoveStatusListener(closed)
	replies := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(m.Reply, replies)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishMsg(m); err != nil {
		return nil, err
	}
	select {
	case r := <-replies:
		return r, nil
	case <-closed:
		return nil, nats.ErrConnectionClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// requestNodeAcross is RequestNode for a request that may wait long and
// that its node answers the same when asked again (askedAcross):
// requestAcross, with a reply subject the node's credentials let it
// answer.
func requestNodeAcross(ctx context.Context, nc *nats.Conn, node, subject string, body []byte) (*nats.Msg, error) {
	inbox := nc.NewInbox()
	return requestAcross(ctx, nc, subject, schemas.NodeReplyPrefix(node)+inbox[strings.LastIndexByte(inbox, '.'):], body, nil, 0, nil)
}

// askedAcross verbs are answered the same when asked again: those that
// act carry a request id their node dedupes (a run may take its turn's
// minutes, an open the open's timeout, an ACP agent's handshake); the
// work and the diff of an agent are read from its checkout, one reader at
// a time, and the same work is the same commit and bundle, stored once. A
// reply lost while the fabric was away (a coordinator restarted) is asked
// for again once the caller's connection is back, where it waited out the
// attempt's share of the request's time: the node's heartbeat entry
// (whileNodeLives) outlives a short outage.
func askedAcross(verb schemas.Verb) bool {
	switch verb {
	case schemas.VerbOpen, schemas.VerbSend, schemas.VerbRun, schemas.VerbInterrupt, schemas.VerbClose, schemas.VerbSetModel,
		schemas.VerbWork, schemas.VerbDiff:
		return true
	}
	return false
}

// retryable verbs carry a request id the node dedupes, or only read.
func retryable(verb schemas.Verb) bool {
	return verb != schemas.VerbList
}
