package bridge

import (
	"context"
	"crypto/rand"
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
)

// Fabric is a client of the agent fabric over NATS: it finds nodes, sends
// each request about an agent to the node that owns it, and reads agent
// records from KV. The command line and the MCP tools both drive the
// fabric through it.
type Fabric struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	timeout time.Duration
	remote  bool
	// readOnly names the credentials that may only observe, or "".
	readOnly bool

	mu    sync.Mutex
	cache *nodeCache
}

// FabricConfig configures a Fabric; its zero value works.
type FabricConfig struct {
	// Timeout bounds a request when the caller's context has no deadline;
	// 30s when zero.
	Timeout time.Duration
	// ViaCoordinator sends every request through the coordinator's
	// fabric service (shoal.fabric.*) instead of reaching the nodes and
	// the stream directly: what a client with scoped credentials does.
	ViaCoordinator bool
	// ReadOnly refuses, before asking anyone, what an observer's
	// credentials may not do: open, send, run, interrupt, close and
	// set_model. The server would refuse them anyway, but only by
	// letting the request time out.
	ReadOnly bool
}

// NewFabric returns a client on nc.
func NewFabric(nc *nats.Conn, cfg FabricConfig) (*Fabric, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Fabric{nc: nc, js: js, timeout: cfg.Timeout, remote: cfg.ViaCoordinator, readOnly: cfg.ReadOnly}, nil
}

// Conn is the fabric client's NATS connection.
func (f *Fabric) Conn() *nats.Conn { return f.nc }

// JetStream is the fabric client's JetStream handle.
func (f *Fabric) JetStream() jetstream.JetStream { return f.js }

// Open starts an agent on the node req names or, through placement, on
// the least loaded node that can run it.
func (f *Fabric) Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	if f.remote {
		req.RequestID = requestID(req.RequestID)
		var rep schemas.OpenReply
		return rep, f.viaCoordinator(ctx, "open", req, &rep, 0)
	}
	if req.Node != "" {
		if err := schemas.ValidID(req.Node); err != nil {
			return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "node %v", err)
		}
	}
	nodes, err := f.Nodes(ctx)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	node, err := place(nodes, req)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	req.Node = node
	req.RequestID = requestID(req.RequestID)
	if req.ID == "" {
		// A retry of this request names the same agent, so wherever
		// placement sends it, it finds the agent the first attempt opened.
		req.ID = derivedID(req.RequestID)
	}
	var rep schemas.OpenReply
	err = f.request(ctx, node, schemas.VerbOpen, req, &rep, 0)
	if schemas.CodeOf(err) == schemas.CodeConflict {
		if rec, _, rerr := f.Record(ctx, req.ID); rerr == nil && rec.RequestID == req.RequestID && rec.Status != schemas.StatusDead {
			return schemas.OpenReply{AgentID: rec.ID, Node: rec.Node}, nil
		}
	}
	return rep, err
}

// derivedID is the agent id an open request names when the caller chose
// none: 8 hex characters of a hash of its request id.
func derivedID(requestID string) string {
	sum := sha256.Sum256([]byte("shoal-open/" + requestID))
	return hex.EncodeToString(sum[:4])
}

// Send writes a user turn to an agent.
func (f *Fabric) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SendReply
	if f.remote {
		return rep, f.viaCoordinator(ctx, "send", req, &rep, 0)
	}
	return rep, f.toOwner(ctx, req.AgentID, schemas.VerbSend, req, &rep, 0)
}

// Run sends a turn and waits for its end. It watches the agent's record
// while it waits, not only its node: a node that dies or restarts during
// the turn never answers, and the fabric marks its agents dead within
// the node heartbeat's lifetime, which ends the wait as unavailable.
func (f *Fabric) Run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	timeout, err := schemas.RunTimeout(req.Timeout)
	if err != nil {
		return schemas.RunReply{}, err
	}
	req.RequestID = requestID(req.RequestID)
	var rep schemas.RunReply
	if f.remote {
		return rep, f.viaCoordinator(ctx, "run", req, &rep, timeout+60*time.Second)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := f.watchLoss(ctx, req.AgentID)
	answered := make(chan error, 1)
	go func() { answered <- f.toOwner(ctx, req.AgentID, schemas.VerbRun, req, &rep, timeout+30*time.Second) }()
	select {
	case err := <-answered:
		return rep, err
	case node := <-lost:
		// An agent that died on a live node is answered by its node at
		// once, with what became of the turn; give that a moment.
		select {
		case err := <-answered:
			return rep, err
		case <-time.After(lossGrace):
		}
		return schemas.RunReply{}, schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead: its node %s was lost during the turn", req.AgentID, node)
	}
}

// lossGrace is how long a run whose agent's record turned dead waits for
// its node's own answer.
const lossGrace = 2 * time.Second

// watchLoss reports, once, the node of an agent whose record turns dead
// (or is taken by another life) while it is watched, until ctx ends.
func (f *Fabric) watchLoss(ctx context.Context, id string) <-chan string {
	lost := make(chan string, 1)
	kv, err := f.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return lost // the node's answer, or the timeout, ends the run
	}
	w, err := kv.Watch(ctx, id)
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
				lost <- rec.Node
				return
			}
		}
	}()
	return lost
}

// Status returns an agent's record from its node, or from KV when the
// node does not answer or no longer keeps the agent.
func (f *Fabric) Status(ctx context.Context, id string) (schemas.AgentRecord, error) {
	if f.remote {
		var rep schemas.AgentRecord
		return rep, f.viaCoordinator(ctx, "status", schemas.AgentRequest{AgentID: id}, &rep, 0)
	}
	switch rec, _, err := f.Record(ctx, id); {
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
		if rec, _, kerr := f.Record(ctx, id); kerr == nil {
			return rec, nil
		}
	}
	return rep, err
}

// CallOption sets an optional part of a control request.
type CallOption func(*schemas.AgentRequest)

// WithRequestID names the request, so that a retry carrying the same id
// gets the first reply and acts once. Without it every call is new.
func WithRequestID(id string) CallOption {
	return func(r *schemas.AgentRequest) { r.RequestID = id }
}

func agentRequest(id string, opts []CallOption) schemas.AgentRequest {
	req := schemas.AgentRequest{AgentID: id}
	for _, o := range opts {
		o(&req)
	}
	req.RequestID = requestID(req.RequestID)
	return req
}

// Interrupt cancels an agent's running turn.
func (f *Fabric) Interrupt(ctx context.Context, id string, opts ...CallOption) (schemas.InterruptReply, error) {
	var rep schemas.InterruptReply
	req := agentRequest(id, opts)
	if f.remote {
		return rep, f.viaCoordinator(ctx, "interrupt", req, &rep, 0)
	}
	return rep, f.toOwner(ctx, id, schemas.VerbInterrupt, req, &rep, 0)
}

// Close stops an agent; an unknown id answers closed false.
func (f *Fabric) Close(ctx context.Context, id string, opts ...CallOption) (schemas.CloseReply, error) {
	var rep schemas.CloseReply
	req := agentRequest(id, opts)
	if f.remote {
		return rep, f.viaCoordinator(ctx, "close", req, &rep, 0)
	}
	err := f.toOwner(ctx, id, schemas.VerbClose, req, &rep, 0)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		return schemas.CloseReply{Closed: false}, nil
	}
	return rep, err
}

// SetModel repoints an agent at another model.
func (f *Fabric) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	req.RequestID = requestID(req.RequestID)
	var rep schemas.SetModelReply
	if f.remote {
		return rep, f.viaCoordinator(ctx, "set_model", req, &rep, 0)
	}
	err := f.toOwner(ctx, req.AgentID, schemas.VerbSetModel, req, &rep, 0)
	if schemas.CodeOf(err) == schemas.CodeNotFound {
		return schemas.SetModelReply{Switched: false}, nil
	}
	return rep, err
}

// List returns every agent record in the fabric, dead ones included,
// oldest first.
func (f *Fabric) List(ctx context.Context) ([]schemas.AgentRecord, error) {
	if f.remote {
		var rep schemas.ListReply
		return rep.Agents, f.viaCoordinator(ctx, "list", schemas.ListRequest{}, &rep, 0)
	}
	kv, err := f.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	recs := []schemas.AgentRecord{}
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) == nil {
			recs = append(recs, rec)
		}
	}
	slices.SortFunc(recs, func(a, b schemas.AgentRecord) int {
		if a.CreatedAt != b.CreatedAt {
			if a.CreatedAt < b.CreatedAt {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	return recs, nil
}

// Record reads an agent's record from KV, with its revision.
func (f *Fabric) Record(ctx context.Context, id string) (schemas.AgentRecord, uint64, error) {
	if err := schemas.ValidID(id); err != nil {
		return schemas.AgentRecord{}, 0, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	if f.remote {
		var rec schemas.AgentRecord
		return rec, 0, f.viaCoordinator(ctx, "record", schemas.AgentRequest{AgentID: id}, &rec, 0)
	}
	kv, err := f.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return schemas.AgentRecord{}, 0, schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.AgentsBucket, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.AgentRecord{}, 0, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
	}
	if err != nil {
		return schemas.AgentRecord{}, 0, schemas.Errf(schemas.CodeUnavailable, "read agent %s: %v", id, err)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return schemas.AgentRecord{}, 0, schemas.Errf(schemas.CodeInternal, "agent %s has a malformed record: %v", id, err)
	}
	return rec, e.Revision(), nil
}

// toOwner sends a request about an agent to the node that owns it. An
// agent whose record says dead is answered without asking a node that
// may be gone (or restarted, and no longer keeping it), as its node
// answers for a dead agent it keeps: a turn is refused, an interrupt
// interrupts nothing, a close finds it closed.
func (f *Fabric) toOwner(ctx context.Context, id string, verb schemas.Verb, req, rep any, timeout time.Duration) error {
	rec, _, err := f.Record(ctx, id)
	if err != nil {
		return err
	}
	if rec.Status == schemas.StatusDead {
		switch r := rep.(type) {
		case *schemas.InterruptReply:
			*r = schemas.InterruptReply{Interrupted: false}
			return nil
		case *schemas.CloseReply:
			*r = schemas.CloseReply{Closed: true}
			return nil
		case *schemas.SetModelReply:
			*r = schemas.SetModelReply{Switched: false}
			return nil
		}
		if verb == schemas.VerbSend || verb == schemas.VerbRun {
			return schemas.Errf(schemas.CodeUnavailable, "agent '%s' is dead", id)
		}
	}
	return f.request(ctx, rec.Node, verb, req, rep, timeout)
}

// request sends one control request to a node and decodes its reply. A
// request that carries a request id is sent again, under the same id,
// when its reply is lost or the node is briefly away: the node answers a
// retry with its first reply, so a retried request never acts twice.
func (f *Fabric) request(ctx context.Context, node string, verb schemas.Verb, req, rep any, timeout time.Duration) error {
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
		msg, err = requestNode(attempt, f.nc, node, schemas.ControlSubject(node, verb), body)
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
	case errors.Is(err, nats.ErrNoResponders):
		return schemas.Errf(schemas.CodeUnavailable, "node %s is not reachable", node)
	case errors.Is(err, context.DeadlineExceeded):
		return schemas.Errf(schemas.CodeTimeout, "node %s did not answer %s in time", node, verb)
	case err != nil:
		return schemas.Errf(schemas.CodeUnavailable, "%s request to node %s: %v", verb, node, err)
	}
	return schemas.DecodeReply(msg.Data, rep)
}

// requestNode sends a request to one of node's subjects with a reply
// subject under schemas.NodeReplyPrefix(node), where the node's
// credentials let it answer even from behind a leaf connection.
func requestNode(ctx context.Context, nc *nats.Conn, node, subject string, body []byte) (*nats.Msg, error) {
	inbox := nc.NewInbox()
	reply := schemas.NodeReplyPrefix(node) + inbox[strings.LastIndexByte(inbox, '.'):]
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: body}); err != nil {
		return nil, err
	}
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, err
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return m, nil
}

// retryable verbs carry a request id the node dedupes, or only read.
func retryable(verb schemas.Verb) bool {
	return verb != schemas.VerbList
}

// requestID returns id, or a fresh one, so that a retried request is
// recognised by its owner.
func requestID(id string) string {
	if id != "" {
		return id
	}
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
