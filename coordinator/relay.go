package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Relay is the coordinator's door for confined nodes: nodes whose
// credentials let them publish only under shoal.relay.<node>. It checks
// every write against the agent records (a node stores events and writes
// records only for agents it owns, and beats only under its own name) and
// forwards it to the stream or bucket with the node's own reply subject,
// so JetStream acknowledges the write to the node directly.
//
// It answers nothing to a reply subject outside the node's inbox: a reply
// is a publish on the replier's rights, and the relay's rights reach the
// stream.
type Relay struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	agents  jetstream.KeyValue
	nodes   jetstream.KeyValue
	permits jetstream.KeyValue
	events  jetstream.Stream
	recs    jetstream.Stream
	log     *slog.Logger
	ready   chan struct{}

	metrics RelayMetrics
	mcp     func(ctx context.Context) (url, token string)
	bun     bundles
	dial    func(name string) (*nats.Conn, error)
	doors   *doors

	// eventsWaiting bounds each node's events waiting in its lane; turns
	// orders each agent's events across nodes (see lanes.go).
	eventsWaiting int
	turns         agentTurns
	busyEvents    sync.Map // node -> its answer to an event its lane has no room for

	// acks is the subject prefix of the relay's own replies, under which
	// JetStream acknowledges what the relay forwards; tokens names each.
	acks   string
	tokens atomic.Uint64
	// fwd is the connection events are forwarded on, one that buffers
	// nothing while it connects again (see settle); nc itself when nc is
	// one.
	fwd *nats.Conn

	mu       sync.Mutex
	owners   map[string]string              // agent id -> owner node, from the agents bucket
	statuses map[string]schemas.AgentStatus // agent id -> its record's status
	revs     map[string]uint64              // agent id -> the revision of its record owners and statuses hold
	deleted  map[string]deletion            // agent id -> its record's deletion, lately
	forget   int                            // deleted is pruned once it holds this many
	seqs     map[string]*sequence           // agent id -> what the relay knows of its numbering
	inflight map[string]inflight            // reply token -> a forwarded event awaiting its acknowledgement
	// gen is how many times fwd had connected again when the relay last
	// looked; doubted holds the agents whose forwards in flight were lost
	// with an earlier connection, until one of theirs is forwarded again.
	gen      uint64
	doubted  map[string]bool
	warned   map[string]bool      // refusals already logged
	warnings map[string]*warnings // node -> what was logged of its refusals lately
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Conn is a connection with the coordinator's rights.
	Conn *nats.Conn
	// Logger receives refusals; discarded when nil.
	Logger *slog.Logger
	// Metrics counts refusals; nil counts nothing.
	Metrics RelayMetrics
	// MCP, when set, tells where the coordinator's MCP endpoint is and its
	// token, waiting until both are known (or ctx ends); a node's hello is
	// then answered with the node's key (schemas.NodeKey), so its agents
	// reach the endpoint under tokens of their own. An empty token grants
	// nothing.
	MCP func(ctx context.Context) (url, token string)
	// MaxBundle is the largest bundle a node may write through the relay;
	// client.DefaultMaxBundle when zero (a caller's fetch takes no more).
	MaxBundle int64
	// EventsWaiting is how many of a node's events may wait at the relay
	// behind the one it handles, past which the node is answered busy;
	// schemas.MaxEventsAhead when zero, the most a node's publisher has
	// unacknowledged.
	EventsWaiting int
	// Dial, when set, connects one more connection with the relay's
	// rights under the connection name it is given: the relay hears each
	// confined node on a connection of its own (see doors.go), so one
	// node's bytes cannot have the server cut the connection every other
	// node's operations come on. Nil: every node is heard on Conn.
	Dial func(name string) (*nats.Conn, error)
}

// RelayMetrics receives what the relay counts. Its methods are called
// from many goroutines and must not block.
type RelayMetrics interface {
	// Refused counts a node's write the relay refused (or dropped, its
	// reply not being the node's inbox), by relay operation.
	Refused(op schemas.RelayOp)
}

type noRelayMetrics struct{}

func (noRelayMetrics) Refused(schemas.RelayOp) {}

// eventDecideWait bounds the relay's decision on a node's event (the
// reads of its record and its stream's end): past it, the node is
// answered 503 and sends the event again. relayOpWait bounds any other
// operation of a node's, long after the node stopped waiting for it.
const (
	eventDecideWait = 10 * time.Second
	relayOpWait     = time.Minute
)

// relayQueue is the queue group relays share, so each message is
// forwarded once; NATS prefers the relay on the server the node is
// connected to, which keeps a node's events in order.
const relayQueue = "shoal-relay"

// NewRelay checks cfg; Run binds the fabric's stream and buckets.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.Conn == nil {
		return nil, errors.New("the relay needs a NATS connection")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noRelayMetrics{}
	}
	if cfg.MaxBundle <= 0 {
		cfg.MaxBundle = client.DefaultMaxBundle
	}
	if cfg.EventsWaiting <= 0 {
		cfg.EventsWaiting = schemas.MaxEventsAhead
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	return &Relay{nc: cfg.Conn, js: js, log: cfg.Logger.With("component", "relay"), ready: make(chan struct{}), metrics: cfg.Metrics, mcp: cfg.MCP, dial: cfg.Dial,
		acks: schemas.RelayAckPrefix + "." + nuid.Next(), eventsWaiting: cfg.EventsWaiting,
		owners: map[string]string{}, statuses: map[string]schemas.AgentStatus{}, revs: map[string]uint64{}, seqs: map[string]*sequence{},
		deleted: map[string]deletion{}, forget: deletionsKept, inflight: map[string]inflight{}, warned: map[string]bool{}, warnings: map[string]*warnings{}, doubted: map[string]bool{},
		bun: bundles{max: cfg.MaxBundle, reads: map[string]*bundleRead{}, writes: map[string]*bundleWrite{}}}, nil
}

// Ready is closed once the relay forwards writes.
func (r *Relay) Ready() <-chan struct{} { return r.ready }

// bind opens the stream and buckets the relay writes to.
func (r *Relay) bind(ctx context.Context) error {
	var err error
	if r.agents, err = r.js.KeyValue(ctx, schemas.AgentsBucket); err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	if r.nodes, err = r.js.KeyValue(ctx, schemas.NodesBucket); err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	if r.events, err = r.js.Stream(ctx, schemas.StreamName); err != nil {
		return fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	if r.permits, err = r.js.KeyValue(ctx, schemas.PermitsBucket); err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.PermitsBucket, err)
	}
	if r.recs, err = r.js.Stream(ctx, "KV_"+schemas.AgentsBucket); err != nil {
		return fmt.Errorf("open the stream of %s: %w", schemas.AgentsBucket, err)
	}
	return nil
}

// Run relays until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.bind(ctx); err != nil {
		return err
	}
	defer r.bun.stop()
	w, err := client.WatchAllKeys(ctx, r.nc, r.agents)
	if err != nil {
		return fmt.Errorf("watch %s: %w", schemas.AgentsBucket, err)
	}
	defer w.Stop()
	caughtUp := make(chan struct{})
	go r.watchOwners(w, caughtUp)

	// Operations that wait (on the stream, a bucket, another request) run
	// beside the subscription, each node's in its own bounded share, so a
	// node's flood waits on itself alone; a node's heartbeats have a share
	// of their own, so they never wait behind its other work either.
	// A node's events are handled in its own lane, one at a time in the
	// order they arrive, beside other nodes' events.
	work := newShares(relayInFlight, relayWaiting, relayWaitingBytes)
	beats := newShares(1, beatsWaiting, beatsWaitingBytes)
	events := newLanes(r.eventsWaiting, relayEventBytes, func(m *nats.Msg) {
		if ctx.Err() != nil {
			// Stopping: what waits in the lanes is not refused for lack
			// of the reads it would need, but sent again by its node.
			r.stopping(m)
			return
		}
		// A read that gets no answer (lost with a connection cut as it
		// went) must not hold the node's lane: every later event of the
		// node waits behind this one.
		ectx, cancel := context.WithTimeout(ctx, eventDecideWait)
		defer cancel()
		r.event(ectx, m)
	})
	defer beats.stop()
	defer work.stop()
	defer events.stop()
	// wait bounds each operation: no answer lost (with a connection cut
	// as it went) holds a place of the node's share for ever. A bundle's
	// chunks are not bounded so: the read or write a chunk begins goes
	// on across the node's next chunks, under the context it began with.
	async := func(in *shares, h func(context.Context, *nats.Msg), wait time.Duration) nats.MsgHandler {
		return func(m *nats.Msg) {
			node, op, _, ok := schemas.ParseRelaySubject(m.Subject)
			if !ok {
				return
			}
			if !in.do(node, laneBytes(m), func() {
				if wait == 0 {
					h(ctx, m)
					return
				}
				octx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				h(octx, m)
			}) {
				r.busy(m, node, op, in.inFlight+in.waiting)
			}
		}
	}
	handlers := map[schemas.RelayOp]nats.MsgHandler{
		schemas.RelayEvent: func(m *nats.Msg) {
			node, op, _, ok := schemas.ParseRelaySubject(m.Subject)
			if ok && !events.add(node, m) {
				r.eventBusy(m, node, op)
			}
		},
		schemas.RelayRecord: async(work, r.record, relayOpWait),
		schemas.RelayBeat:   async(beats, r.beat, relayOpWait),
		schemas.RelayGet:    async(work, r.get, relayOpWait),
		schemas.RelayOwned:  async(work, r.owned, relayOpWait),
		schemas.RelayLast:   async(work, r.last, relayOpWait),
		schemas.RelayHello:  async(work, r.hello, relayOpWait),
		schemas.RelayGrant:  async(work, r.grant, relayOpWait),
		schemas.RelayPermit: async(work, r.permit, relayOpWait),
		// A bundle's chunks: a node asks for the next once it has the
		// one before.
		schemas.RelayBundleGet: async(work, r.bundleGet, 0),
		schemas.RelayBundlePut: async(work, r.bundlePut, 0),
		schemas.RelayBudget:    async(work, r.budget, relayOpWait),
	}
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			s.Drain()
		}
	}()
	fwd, closeFwd, err := forwardingConn(r.nc)
	if err != nil {
		return err
	}
	var ending atomic.Bool
	defer func() {
		ending.Store(true) // closed by the relay's end, not lost
		closeFwd()
	}()
	if fwd != r.nc {
		// Forwards that could not go on would leave every confined
		// node's events unstored: the relay's own connection is closed
		// with it, and the coordinator starts the relay again.
		fwd.SetClosedHandler(func(*nats.Conn) {
			if ctx.Err() == nil && !ending.Load() {
				r.log.Error("the relay's connection for events closed; the relay starts again")
				r.nc.Close()
			}
		})
	}
	r.fwd = fwd
	r.gen = fwd.Stats().Reconnects
	acks, err := fwd.Subscribe(r.acks+".*", r.acked)
	if err != nil {
		return fmt.Errorf("relay acknowledgements: %w", err)
	}
	acks.SetPendingLimits(-1, 256<<20)
	subs = append(subs, acks)
	st, err := r.nodes.Status(ctx)
	if err != nil {
		return fmt.Errorf("read KV bucket %s: %w", schemas.NodesBucket, err)
	}
	idle := doorIdle(st.TTL())
	// Each node is heard on its own door; the lobby hears every node's
	// first words and opens its door (doors.go).
	r.doors = &doors{dial: r.dial, shared: r.nc, log: r.log, open: map[string]*door{}, handle: func(m *nats.Msg) {
		_, op, agent, ok := schemas.ParseRelaySubject(m.Subject)
		if h := handlers[op]; ok && h != nil && (agent != "") == schemas.RelayOpNamesAgent(op) {
			h(m)
			return
		}
		r.malformed(m)
	}}
	go func() {
		t := time.NewTicker(ackWait / 4)
		defer t.Stop()
		sweep := time.NewTicker(idle / 3)
		defer sweep.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				r.prune(now)
			case now := <-sweep.C:
				r.doors.sweep(now, idle)
			}
		}
	}()

	lobby := r.nc
	if r.dial != nil {
		if lobby, err = r.dial("shoal-relay-lobby"); err != nil {
			return fmt.Errorf("the relay's lobby: %w", err)
		}
		defer lobby.Close()
		lobby.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				r.log.Warn("the relay's lobby, where nodes without a door say hello, was cut; it connects again", "err", err)
			}
		})
		// A lobby that gave up connecting again (the server refused it
		// for want of room, past its tries) would leave every node
		// without a door unheard for good: the relay's own connection is
		// closed with it, and the coordinator starts the relay again, as
		// for any service whose connection closed.
		lobby.SetClosedHandler(func(*nats.Conn) {
			if ctx.Err() == nil {
				r.log.Error("the relay's lobby closed; the relay starts again")
				r.nc.Close()
			}
		})
	}
	r.doors.lobby = lobby
	defer r.doors.stop() // before the lobby closes
	for _, first := range []struct {
		op schemas.RelayOp
		in *shares
		h  func(context.Context, *nats.Msg)
	}{{schemas.RelayHello, work, r.hello}, {schemas.RelayBeat, beats, r.beat}, {schemas.RelayGrant, work, r.grant}} {
		// Answered once the node's door is open (or failed to open).
		opened := async(first.in, func(ctx context.Context, m *nats.Msg) {
			node, _, _, _ := schemas.ParseRelaySubject(m.Subject)
			wait, cancel := context.WithTimeout(ctx, doorOpenWait)
			r.doors.enter(node).wait(wait)
			cancel()
			first.h(ctx, m)
		}, doorOpenWait+relayOpWait)
		s, err := lobby.Subscribe(schemas.RelayWildcard(first.op), func(m *nats.Msg) {
			node, _, _, ok := schemas.ParseRelaySubject(m.Subject)
			if !ok || !r.doors.lobbyTakes(node, m) {
				return // its door has it
			}
			r.doors.enter(node)
			opened(m)
		})
		if err != nil {
			return fmt.Errorf("relay %s: %w", first.op, err)
		}
		s.SetPendingLimits(-1, doorPending)
		subs = append(subs, s)
	}
	if err := lobby.Flush(); err != nil {
		return err
	}
	if err := r.enterKnown(ctx, caughtUp); err != nil {
		return err
	}
	close(r.ready)
	<-ctx.Done()
	return nil
}

// enterKnown opens, as the relay starts, the doors of the nodes that may
// be running: every node whose heartbeat was written through a relay, and
// every owner of a living agent that has no heartbeat entry (one whose
// entry expired while the coordinator was away); not a node writing its
// own heartbeats. So nodes running across the relay's restart find their
// doors before their next heartbeat. It waits, a while, for them to open.
func (r *Relay) enterKnown(ctx context.Context, caughtUp <-chan struct{}) error {
	keys, err := r.nodes.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("list KV bucket %s: %w", schemas.NodesBucket, err)
	}
	relayed := map[string]bool{} // node -> whether its entry says relayed
	for key := range keys.Keys() {
		e, err := r.nodes.Get(ctx, key)
		if err != nil {
			continue // gone meanwhile
		}
		var rec schemas.NodeRecord
		relayed[key] = json.Unmarshal(e.Value(), &rec) == nil && rec.Relayed
	}
	select {
	case <-caughtUp:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	for id, node := range r.owners {
		if _, known := relayed[node]; !known && r.statuses[id] != schemas.StatusDead {
			relayed[node] = true
		}
	}
	r.mu.Unlock()
	var opening []*door
	for node, ok := range relayed {
		if ok && schemas.ValidID(node) == nil {
			opening = append(opening, r.doors.enter(node))
		}
	}
	wait, cancel := context.WithTimeout(ctx, doorOpenWait)
	defer cancel()
	for _, dr := range opening {
		dr.wait(wait)
	}
	return ctx.Err()
}

// relayInFlight, relayWaiting and relayWaitingBytes are each node's
// share of the relay's work: this many of its operations at once, this
// many more waiting, holding at most so many bytes of messages; past
// that the node is answered busy (schemas.HeaderRelayBusy) and sends the
// operation again after a moment, so an honest burst (a record written
// for each of hundreds of agents starting their turns at once) is slowed,
// not lost, and a flood waits on itself, bounded in memory. Heartbeats
// (and the records of a node's load written at each open) have a share
// of their own.
const (
	relayInFlight     = 8
	relayWaiting      = 256
	relayWaitingBytes = 64 << 20
	beatsWaiting      = 64
	beatsWaitingBytes = 4 << 20
)

// relayEventBytes bounds the bytes of a node's events waiting in its
// lane, as eventsWaiting bounds their number.
const relayEventBytes = 64 << 20

// busy answers an operation of node's that its share of the relay's work
// has no room for, as op's answers are read, and logs it once per node.
func (r *Relay) busy(m *nats.Msg, node string, op schemas.RelayOp, held int) {
	r.metrics.Refused(op)
	r.warn(node+"/busy", "a node has more relay operations than its share; answered busy", "node", node, "op", op)
	if !strings.HasPrefix(m.Reply, schemas.InboxPrefix("node", node)+".") || len(m.Reply) > schemas.MaxReplySubject {
		return
	}
	msg := fmt.Sprintf("node %s has %d relay operations running or waiting already; %s is not taken: send it again once they are answered", node, held, op)
	var body any
	answer := nats.NewMsg(m.Reply)
	switch op {
	case schemas.RelayRecord, schemas.RelayBeat, schemas.RelayPermit:
		body = pubAckError(503, 0, msg)
	case schemas.RelayBundleGet, schemas.RelayBundlePut:
		// A chunk's answer says an error by a header of its own (its
		// body is the chunk otherwise); busy, it is sent again.
		answer.Header.Set(schemas.HeaderRelayError, "1")
		body = schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "%s", msg)}
	default:
		body = schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "%s", msg)}
	}
	b, _ := json.Marshal(body)
	answer.Header.Set(schemas.HeaderRelayBusy, strconv.Itoa(held))
	answer.Data = b
	r.nc.PublishMsg(answer)
}

// eventBusy answers an event its node's lane has no room for. A node that
// floods its lane is answered as often as it sends, so the answer is made
// once per node, and the refusal logged then.
func (r *Relay) eventBusy(m *nats.Msg, node string, op schemas.RelayOp) {
	a, ok := r.busyEvents.Load(node)
	if !ok {
		r.warn(node+"/busy-events", "a node has more events waiting than its lane holds; answered busy", "node", node)
		b, _ := json.Marshal(pubAckError(503, 0, fmt.Sprintf("node %s has events waiting already (up to %d, or %d bytes); this one is not taken: send it again once they are answered",
			node, r.eventsWaiting, relayEventBytes)))
		a, _ = r.busyEvents.LoadOrStore(node, b)
	}
	r.metrics.Refused(op)
	if strings.HasPrefix(m.Reply, schemas.InboxPrefix("node", node)+".") && len(m.Reply) <= schemas.MaxReplySubject {
		r.nc.Publish(m.Reply, a.([]byte))
	}
}

// stopping answers an event the relay will not handle, stopping, so its
// node sends it again.
func (r *Relay) stopping(m *nats.Msg) {
	node, _, _, ok := schemas.ParseRelaySubject(m.Subject)
	if ok && strings.HasPrefix(m.Reply, schemas.InboxPrefix("node", node)+".") && len(m.Reply) <= schemas.MaxReplySubject {
		replyJSON(r.nc, m.Reply, pubAckError(503, 0, "the relay is stopping: send the event again"))
	}
}

// watchOwners keeps the relay's view of the agents bucket; caughtUp is
// closed once it holds every record the bucket held when the watch began.
func (r *Relay) watchOwners(w jetstream.KeyWatcher, caughtUp chan<- struct{}) {
	for e := range w.Updates() {
		if e == nil {
			if caughtUp != nil {
				close(caughtUp)
				caughtUp = nil
			}
			continue
		}
		r.mu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			var rec schemas.AgentRecord
			if json.Unmarshal(e.Value(), &rec) == nil {
				r.learn(e.Key(), rec, e.Revision())
			}
		} else {
			delete(r.owners, e.Key())
			delete(r.statuses, e.Key())
			delete(r.revs, e.Key())
			delete(r.seqs, e.Key())
			r.deleted[e.Key()] = deletion{rev: e.Revision(), at: time.Now()}
			r.pruneDeleted()
		}
		r.mu.Unlock()
	}
}

// A deletion is when, and at which revision of the bucket, an agent's
// record was deleted: a bucket read begun before it and taken in after
// must not bring the agent back into the view.
type deletion struct {
	rev uint64
	at  time.Time
}

// Deletions are kept deletionAge, far longer than any bucket read of a
// lane takes, and looked over for those older once deletionsKept (then
// twice as many as are left) are held.
const (
	deletionAge   = 5 * time.Minute
	deletionsKept = 1024
)

// pruneDeleted forgets the deletions older than deletionAge once many are
// held. Called with r.mu held.
func (r *Relay) pruneDeleted() {
	if len(r.deleted) < r.forget {
		return
	}
	for id, d := range r.deleted {
		if time.Since(d.at) > deletionAge {
			delete(r.deleted, id)
		}
	}
	r.forget = max(deletionsKept, 2*len(r.deleted))
}

// learn takes agent id's record, at revision rev of the bucket, into the
// relay's view of owners and statuses, unless the view holds a later
// revision already: the watch and the bucket reads of many nodes' lanes
// come in any order, and an earlier record must not bring back an owner,
// or a life, that a later one ended, nor an agent whose record a later
// revision deleted. Called with r.mu held.
func (r *Relay) learn(id string, rec schemas.AgentRecord, rev uint64) {
	if d, ok := r.deleted[id]; rev < r.revs[id] || ok && rev < d.rev {
		return
	}
	delete(r.deleted, id)
	r.revs[id] = rev
	r.owners[id] = rec.Node
	r.statuses[id] = rec.Status
	if rec.Status != schemas.StatusDead {
		r.reborn(id, rec)
	}
}

// AgentsByStatus counts the fabric's agent records by status, as the
// relay's watch of the agents bucket has them; every status a record can
// hold is present, with 0 for none.
func (r *Relay) AgentsByStatus() map[schemas.AgentStatus]int {
	out := map[schemas.AgentStatus]int{}
	for _, s := range []schemas.AgentStatus{schemas.StatusStarting, schemas.StatusIdle, schemas.StatusWorking, schemas.StatusDead} {
		out[s] = 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.statuses {
		out[s]++
	}
	return out
}

// from checks that m came from node's own connection, which is the only
// one that receives replies under its inbox: a message without such a
// reply is one the server published on someone else's behalf, and it is
// dropped unanswered.
func (r *Relay) from(m *nats.Msg) (node, agent string, ok bool) {
	node, op, agent, ok := schemas.ParseRelaySubject(m.Subject)
	if !ok {
		return "", "", false
	}
	if !repliesToNode(m, node) {
		r.metrics.Refused(op)
		r.warn(node+"/reply", "dropped a relay message whose reply is not the node's inbox", "node", node, "subject", m.Subject, "reply", m.Reply)
		return "", "", false
	}
	return node, agent, true
}

// malformed answers a message on a subject of a node's namespace that
// names no operation of the relay: an unknown one, one without the agent
// it takes or with one it does not, an agent id that is no id. The node
// is told, on its own inbox, as a malformed body is told.
func (r *Relay) malformed(m *nats.Msg) {
	node := schemas.RelaySubjectNode(m.Subject)
	if schemas.ValidID(node) != nil || !repliesToNode(m, node) {
		return
	}
	subject := fmt.Sprintf("%.120q", m.Subject)
	r.warn(node+"/subject", "answered a relay message whose subject names no operation", "node", node, "subject", subject)
	replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid,
		"subject %s names no operation of the relay: want %s.<operation>, and .<agent id> after %s", subject, strings.TrimSuffix(schemas.RelayNamespace(node), ".>"), schemas.RelayAgentOps())})
}

// repliesToNode reports whether m's reply subject is node's inbox, within
// the bound on reply subjects: the only place the relay answers a node.
func repliesToNode(m *nats.Msg, node string) bool {
	return strings.HasPrefix(m.Reply, schemas.InboxPrefix("node", node)+".") && len(m.Reply) <= schemas.MaxReplySubject
}

// event forwards an event of an agent the node owns to agent.<id>: a
// Kaimon envelope, numbered as the agent's next event (see sequence.go).
// Whatever it refuses, the node is told why.
func (r *Relay) event(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	if err := eventHeaders(m.Header, node, id); err != nil {
		r.refuse(m, node, id, err)
		return
	}
	if owns, err := r.owns(ctx, node, id); err != nil || !owns {
		r.refuseOrRetry(m, node, id, cmpErr(err, notOwner(node, id)))
		return
	}
	if bytes.ContainsAny(m.Data, "\r\n") {
		// JSON allows them between values, and a node of Shoal's never
		// writes them: a reader of lines (shoal tail --json, a Kaimon
		// subscriber's log) would take what follows one for another event.
		r.refuse(m, node, id, errors.New("the event holds a line break between its values; an event envelope is one line of JSON"))
		return
	}
	ev, err := schemas.Decode(m.Data)
	if err != nil {
		r.refuse(m, node, id, fmt.Errorf("the event is not an event envelope: %v", err))
		return
	}
	_, n, _ := schemas.ParseMsgID(m.Header.Get(schemas.HeaderMsgID))
	// The node's word for the agent's last stored event is the relay's
	// to read, not stored with the event.
	acked, claims := uint64(0), false
	if v := m.Header.Get(schemas.HeaderAcked); v != "" {
		acked, claims = parseAcked(v)
		m.Header.Del(schemas.HeaderAcked)
	}
	// The agent's turn, taken once its owner is known (another node's
	// flood of its id waits on nothing), keeps deciding and forwarding one
	// of its events at a time.
	r.turns.lock(id)
	defer r.turns.unlock(id)
	gen, err := r.settle()
	if err != nil {
		r.refuseOrRetry(m, node, id, err)
		return
	}
	dead, err := r.recordDead(ctx, id)
	v := forward
	if err == nil {
		v, err = r.admit(ctx, node, id, n, m.Data, dead, acked, claims)
	}
	switch {
	case err != nil:
		r.refuseOrRetry(m, node, id, err)
		return
	case v == duplicate:
		r.nc.Publish(m.Reply, duplicateAck())
		return
	}
	st, isStatus := ev.Payload.(schemas.Status)
	_, isResult := ev.Payload.(schemas.Result)
	token := r.token()
	f := inflight{agent: id, n: n, reply: m.Reply, ends: isStatus && st.Status == schemas.StatusDead, at: time.Now(), turn: ev.Turn, result: isResult, gen: gen}
	if v == resume {
		f.after = acked
	}
	if err := r.forwarded(token, node, f); err != nil {
		r.refuseOrRetry(m, node, id, err)
		return
	}
	// Every event carries the node it came from: the fleet's count
	// charges a turn's result to it and its labels.
	m.Header.Set(schemas.HeaderNode, node)
	if err := r.fwd.PublishMsg(&nats.Msg{Subject: schemas.EventSubject(id), Reply: r.acks + "." + token, Header: m.Header, Data: m.Data}); err != nil {
		// The connection went as it was sent (it buffers nothing while
		// it connects again): what went before it may be lost too.
		r.unforward(token, id)
		r.refuseOrRetry(m, node, id, unsure{fmt.Errorf("forward event %d of agent %s: %w", n, id, err)})
	}
}

// unsure is what kept the relay from deciding an event: a read of the
// bucket or the stream that failed. The node is answered 503 and sends
// the event again; a refusal (403) would make it drop the event for good.
type unsure struct{ err error }

func (u unsure) Error() string { return "the relay could not decide it now: " + u.err.Error() }
func (u unsure) Unwrap() error { return u.err }

// cmpErr is err if there is one, else otherwise.
func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// refuseOrRetry answers an event the relay will not store: refused for
// good, or, when it could not decide (unsure), to be sent again.
func (r *Relay) refuseOrRetry(m *nats.Msg, node, id string, err error) {
	if _, again := errors.AsType[unsure](err); again {
		r.warn(node+"/unsure", "could not decide a node's event; answered 503, to be sent again", "node", node, "agent", id, "err", err)
		replyJSON(r.nc, m.Reply, pubAckError(503, 0, err.Error()))
		return
	}
	r.refuse(m, node, id, err)
}

// notOwner is the refusal of an event of agent id, which node does not own.
func notOwner(node, id string) error {
	p := schemas.NodePrincipal(node)
	t := schemas.Target{Agent: id}
	return schemas.Decide(p, schemas.AccessStore, t).Err(p, "store events of", t)
}

// recordDead reports whether agent id's record says dead, as the watched
// view has it, or, when the view says dead, as the bucket says now: a
// reopen may have given the agent a new life the view does not show yet.
func (r *Relay) recordDead(ctx context.Context, id string) (bool, error) {
	r.mu.Lock()
	status := r.statuses[id]
	r.mu.Unlock()
	if status != schemas.StatusDead {
		return false, nil
	}
	return r.bucketDead(ctx, id)
}

// bucketDead reports whether agent id's record says dead as the bucket
// has it now; a record that names a new life clears what the relay knew
// of the old one's death (see learn).
func (r *Relay) bucketDead(ctx context.Context, id string) (bool, error) {
	rec, ok, err := r.bucketRecord(ctx, id)
	return !ok || rec.Status == schemas.StatusDead, err
}

// bucketRecord reads agent id's record as the bucket has it now, and
// takes it into the relay's view; false when there is none to read (or
// what is there is no record), an error (unsure) when it could not be
// read.
func (r *Relay) bucketRecord(ctx context.Context, id string) (schemas.AgentRecord, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var rec schemas.AgentRecord
	e, err := r.agents.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return rec, false, nil
	case err != nil:
		return rec, false, unsure{fmt.Errorf("read agent %s's record: %w", id, err)}
	case json.Unmarshal(e.Value(), &rec) != nil:
		return rec, false, nil
	}
	r.mu.Lock()
	r.learn(id, rec, e.Revision())
	r.mu.Unlock()
	return rec, true, nil
}

// eventHeaders accepts exactly the headers a node sets on an event: its
// event number for this agent, its own name, a time.
func eventHeaders(h nats.Header, node, id string) error {
	for k, v := range h {
		if len(v) != 1 {
			return fmt.Errorf("header %s appears %d times", k, len(v))
		}
		switch k {
		case schemas.HeaderMsgID:
			agent, _, err := schemas.ParseMsgID(v[0])
			if err != nil {
				return err
			}
			if agent != id {
				return fmt.Errorf("message id %s is not an event of agent %s", v[0], id)
			}
		case schemas.HeaderNode:
			if v[0] != node {
				return fmt.Errorf("header %s is %s, not the node's name", k, v[0])
			}
		case schemas.HeaderTime:
		case schemas.HeaderAcked:
			if _, ok := parseAcked(v[0]); !ok {
				return fmt.Errorf("header %s is %q, not an event number", k, v[0])
			}
		default:
			return fmt.Errorf("header %s may not be set by a node", k)
		}
	}
	if h.Get(schemas.HeaderMsgID) == "" {
		return errors.New("the event has no message id")
	}
	return nil
}

// parseAcked reads a schemas.HeaderAcked value.
func parseAcked(v string) (uint64, bool) {
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil && n < 1<<62
}

// permit writes a permission request of an agent the node owns, or its
// answer: the record must name the node and the agent, and its request id
// must make a key of its own.
func (r *Relay) permit(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	var rec schemas.PermitRecord
	switch err := json.Unmarshal(m.Data, &rec); {
	case len(m.Data) > schemas.MaxPermitBytes:
		r.refuse(m, node, id, fmt.Errorf("a permission request of agent %s is %d bytes; a permission request is at most %d (schemas.MaxPermitBytes)", id, len(m.Data), schemas.MaxPermitBytes))
		return
	case err != nil:
		r.refuse(m, node, id, fmt.Errorf("not a permission request: %v", err))
		return
	case rec.AgentID != id || rec.Node != node:
		r.refuse(m, node, id, fmt.Errorf("a permission request of agent %s on node %s may only name them", id, node))
		return
	case schemas.ValidID(rec.RequestID) != nil:
		r.refuse(m, node, id, fmt.Errorf("permission request id %q is not a valid id", rec.RequestID))
		return
	case !r.ownsNow(ctx, node, id):
		r.refuse(m, node, id, fmt.Errorf("agent %s is not node %s's", id, node))
		return
	case rec.Answer == nil && !r.living(ctx, id):
		// Nothing waits on an agent whose life has ended: a new request
		// would be listed to the people who answer them, and nothing
		// would settle it. Answers are the node's to write still: it
		// settles what waited when the agent is closed.
		p := schemas.NodePrincipal(node)
		t := schemas.Target{Agent: id, Owner: node, Ended: true}
		r.refuse(m, node, id, schemas.Decide(p, schemas.AccessStore, t).Err(p, "store a new permission request of", t))
		return
	}
	out := &nats.Msg{Subject: "$KV." + schemas.PermitsBucket + "." + schemas.PermitKey(id, rec.RequestID), Reply: m.Reply, Data: m.Data}
	if rec.Answer != nil {
		// An answer settles a request that is there: written of one that
		// is not, it would be a record nobody asked, and enough of them
		// would push the requests waiting out of what the count below
		// reads. What is stored is the request as it was stored, answered
		// (schemas.Answered): an answer the node made large would
		// otherwise stay a week, uncounted, in the bucket every node
		// shares.
		e, err := r.permits.Get(ctx, schemas.PermitKey(id, rec.RequestID))
		var stored schemas.PermitRecord
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			r.refuse(m, node, id, fmt.Errorf("agent %s has no permission request %s to answer", id, rec.RequestID))
			return
		case err != nil:
			replyJSON(r.nc, m.Reply, pubAckError(503, 0, fmt.Sprintf("read agent %s's permission request %s: %v", id, rec.RequestID, err)))
			return
		case json.Unmarshal(e.Value(), &stored) != nil || stored.AgentID != id || stored.RequestID != rec.RequestID:
			r.refuse(m, node, id, fmt.Errorf("agent %s's permission request %s is not one to answer", id, rec.RequestID))
			return
		}
		out.Data, _ = json.Marshal(schemas.Answered(stored, *rec.Answer))
		out.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(e.Revision(), 10)}}
	}
	if rec.Answer == nil {
		if rec.Deadline <= 0 {
			// One without would wait in every list until the bucket
			// expires it: the monitor denies a lost node's requests at
			// their deadline.
			r.refuse(m, node, id, fmt.Errorf("permission request %s of agent %s has no deadline; a node says when it stops waiting", rec.RequestID, id))
			return
		}
		// When it was asked is the relay's to say (lists put the oldest
		// first), and its labels are held to what a list shows.
		rec.AskedAt = float64(time.Now().UnixNano()) / 1e9
		out.Data, _ = json.Marshal(schemas.FitPermit(rec))
		n, err := r.waiting(ctx, id, rec.RequestID)
		switch {
		case err != nil:
			// The bound is a guard, not the request's business: one that
			// cannot be counted is stored, and the count's trouble logged.
			r.warn(node+"/permits", "could not count an agent's permission requests waiting; storing the new one", "agent", id, "err", err)
		case n >= schemas.MaxPendingPerAgent:
			r.refuse(m, node, id, fmt.Errorf("agent %s has %d permission requests waiting already, the most an agent may (schemas.MaxPendingPerAgent); a new one may wait once one is answered", id, n))
			return
		}
	}
	r.nc.PublishMsg(out)
}

// permitsCounted is how many of an agent's latest permission requests
// the relay reads to count those waiting.
const permitsCounted = 512

// permitsCountWait bounds the count of an agent's waiting permission
// requests: it reads each, up to a MiB, and the node waits 10 s for the
// answer to the request it is counted for. Past it the request is stored
// uncounted; a loaded machine passed five seconds.
const permitsCountWait = 8 * time.Second

// waiting counts agent id's permission requests that wait for an answer
// in the bucket, but for request.
func (r *Relay) waiting(ctx context.Context, id, request string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, permitsCountWait)
	defer cancel()
	keys, err := r.permits.ListKeysFiltered(ctx, schemas.PermitKey(id, "*"))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer keys.Stop()
	var all []string
	for key := range keys.Keys() {
		if key != schemas.PermitKey(id, request) {
			all = append(all, key)
		}
	}
	if over := len(all) + 1 - (schemas.MaxPendingPerAgent + schemas.MaxAnsweredPermits); over > 0 {
		all = r.prunePermits(ctx, all, over)
	}
	if len(all) < schemas.MaxPendingPerAgent {
		return len(all), ctx.Err() // not enough to be past the bound, answered or not
	}
	// The newest writes only: what waits was written lately (the monitor
	// denies what waits past its deadline), and the answered stay for
	// days, each written again as it was answered. A request waiting
	// behind permitsCounted later writes is not counted: the bound is a
	// guard against a flood, which is all recent writes.
	n := 0
	for i, key := range slices.Backward(all) {
		if n >= schemas.MaxPendingPerAgent || i < len(all)-permitsCounted {
			break
		}
		e, err := r.permits.Get(ctx, key)
		if err != nil {
			continue // answered and gone since
		}
		var rec schemas.PermitRecord
		if json.Unmarshal(e.Value(), &rec) == nil && rec.Answer == nil {
			n++
		}
	}
	return n, ctx.Err()
}

// prunePermits removes up to n of the oldest answered requests among keys (an
// agent's, oldest first) from the bucket, so that an agent keeps its
// latest schemas.MaxAnsweredPermits answered ones: the room one agent's
// node takes in the bucket every node shares is bounded, whatever it
// asks and answers. What waits is never removed. It returns the keys
// left.
func (r *Relay) prunePermits(ctx context.Context, keys []string, n int) []string {
	left := make([]string, 0, len(keys))
	reads := n + schemas.MaxPendingPerAgent // at most so many wait among them
	for i, key := range keys {
		if n == 0 || i >= reads {
			left = append(left, keys[i:]...)
			break
		}
		e, err := r.permits.Get(ctx, key)
		var rec schemas.PermitRecord
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			n--
			continue // gone since
		case err != nil || json.Unmarshal(e.Value(), &rec) != nil || rec.Answer == nil:
		case r.permits.Delete(ctx, key, jetstream.LastRevision(e.Revision())) == nil:
			n--
			continue
		}
		left = append(left, key)
	}
	return left
}

// living reports whether agent id's record, as the bucket has it now,
// says its life goes on.
func (r *Relay) living(ctx context.Context, id string) bool {
	rec, ok, _ := r.bucketRecord(ctx, id)
	return ok && rec.Status != schemas.StatusDead
}

// owns reports whether node owns agent id, asking the bucket itself when
// the watched view disagrees (it may lag behind a record just written);
// an error (unsure) when the bucket could not be read.
func (r *Relay) owns(ctx context.Context, node, id string) (bool, error) {
	r.mu.Lock()
	owner, known := r.owners[id]
	r.mu.Unlock()
	if known && owner == node {
		return true, nil
	}
	rec, ok, err := r.bucketRecord(ctx, id)
	return ok && rec.Node == node, err
}

// ownsNow is owns for what a node only asks about: a bucket that could
// not be read answers no.
func (r *Relay) ownsNow(ctx context.Context, node, id string) bool {
	owns, _ := r.owns(ctx, node, id)
	return owns
}

// record writes an agent record with compare-and-set for the node it
// names. Ownership is the coordinator's to give: a client placing an agent
// claims its record for the node before the node hears of it, so a node
// may write only a record that names it already, never create one, never
// give one to another node, and never bring a dead agent back (a reopen
// is a new claim). Nothing about another node's agent, not even its
// record's revision, comes back in a refusal.
func (r *Relay) record(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	expected, del, err := recordHeaders(m.Header)
	if err != nil {
		r.refuse(m, node, id, err)
		return
	}
	var rec schemas.AgentRecord
	if !del {
		if len(m.Data) > schemas.MaxAgentRecordBytes {
			r.refuse(m, node, id, fmt.Errorf("agent %s's record is %d bytes; an agent record is at most %d (schemas.MaxAgentRecordBytes)", id, len(m.Data), schemas.MaxAgentRecordBytes))
			return
		}
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			r.refuse(m, node, id, fmt.Errorf("the record is not an agent record: %v", err))
			return
		}
		if rec.ID != id || rec.Node != node {
			r.refuse(m, node, id, fmt.Errorf("the record names agent %s on node %s", rec.ID, rec.Node))
			return
		}
	}
	key := "$KV." + schemas.AgentsBucket + "." + id
	cur, err := r.recs.GetLastMsgForSubject(ctx, key)
	var live *schemas.AgentRecord
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		replyJSON(r.nc, m.Reply, pubAckError(503, 0, "read the agent's record: "+err.Error()))
		return
	case cur.Header.Get("KV-Operation") == "":
		var old schemas.AgentRecord
		if json.Unmarshal(cur.Data, &old) == nil {
			live = &old
		}
	}
	switch {
	case live == nil || live.Node != node:
		r.refuse(m, node, id, fmt.Errorf("node %s was not given agent %s", node, id))
		return
	case del && live.Status != schemas.StatusDead:
		r.refuse(m, node, id, fmt.Errorf("agent %s is alive; a node removes only the records of its dead agents", id))
		return
	case !del && live.Status == schemas.StatusDead && rec.Status != schemas.StatusDead:
		r.refuse(m, node, id, fmt.Errorf("agent %s is dead; reopening it is a new claim, the coordinator's to make", id))
		return
	case !del:
		if err := sameRights(*live, rec); err != nil {
			r.refuse(m, node, id, err)
			return
		}
	}
	data := m.Data
	if !del {
		held := rec
		if err := r.holdNumbering(ctx, id, *live, &held); err != nil {
			replyJSON(r.nc, m.Reply, pubAckError(503, 0, "read where the agent's numbering stands: "+err.Error()))
			return
		}
		if held.LastEvent != rec.LastEvent || held.Turn != rec.Turn {
			r.log.Warn("a node's record of an agent says its numbering stands past what it sent; held to it", "node", node, "agent", id,
				"last_event", rec.LastEvent, "turn", rec.Turn)
			data, _ = json.Marshal(held)
		}
	}
	switch {
	case expected != cur.Sequence:
		replyJSON(r.nc, m.Reply, pubAckError(400, jetstream.JSErrCodeStreamWrongLastSequence, fmt.Sprintf("wrong last sequence: %d", cur.Sequence)))
		return
	case del && live.Closing != nil:
		// Checked once the write would land: a node that wrote last
		// learns of the coordinator's write as a compare-and-set lost.
		r.refuse(m, node, id, fmt.Errorf("agent %s's close is the coordinator's to finish; its record stays until it has", id))
		return
	case !del && live.ClosedBy != "":
		// A life the coordinator closed is the coordinator's: its record
		// says where the closing events end (last_event, turn), which a
		// node writing it again could move, and a close it keeps could
		// then never be finished. The node may remove it once finished,
		// as it does its other dead agents.
		r.refuse(m, node, id, fmt.Errorf("agent %s's life was closed by the coordinator (%s): its record is the coordinator's, a node may only remove it", id, live.ClosedBy))
		return
	case !del && (rec.ClosedBy != live.ClosedBy || !sameClosing(rec.Closing, live.Closing)):
		// What a monitor finishing the close makes into events, under
		// the coordinator's name.
		r.refuse(m, node, id, fmt.Errorf("a node may not write who closed agent %s or its close (closed_by, closing): the coordinator's", id))
		return
	}
	if del {
		// Forgotten as a node reaching the bucket itself forgets it:
		// the marker carries the record, for as long as the stream
		// keeps events (client.ForgetRecord).
		ttl, err := client.ForgottenTTL(ctx, r.js)
		if err != nil {
			replyJSON(r.nc, m.Reply, pubAckError(503, 0, "read how long the stream keeps events: "+err.Error()))
			return
		}
		f := client.ForgetRecord(id, cur.Data, expected, ttl)
		f.Reply = m.Reply
		r.nc.PublishMsg(f)
		return
	}
	h := nats.Header{}
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expected, 10))
	r.nc.PublishMsg(&nats.Msg{Subject: key, Reply: m.Reply, Header: h, Data: data})
}

// sameClosing reports whether a and b are the same kept close.
func sameClosing(a, b *schemas.Closing) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// sameRights says why a node's write of an agent's record would change
// what the rights rules read of it, which is the coordinator's to say:
// its life (the open's request id), its lineage (parent, depth), its
// reach, the policy the open composed, a sandbox, once it has one, and
// the repository, bundle and caller's repository it is opened from.
func sameRights(live, rec schemas.AgentRecord) error {
	switch {
	case rec.RequestID != live.RequestID:
		return fmt.Errorf("the record is of another life of agent %s than the one its node was given", rec.ID)
	case rec.Parent != live.Parent || rec.Depth != live.Depth:
		return fmt.Errorf("a node may not change agent %s's lineage (parent, depth)", rec.ID)
	case rec.Reach != live.Reach:
		return fmt.Errorf("a node may not change agent %s's reach", rec.ID)
	case live.Sandbox != nil && rec.Sandbox == nil:
		return fmt.Errorf("a node may not take agent %s out of its sandbox", rec.ID)
	case slices.ContainsFunc(rec.SandboxNet, func(h string) bool { return !slices.Contains(live.SandboxNet, h) }):
		// Fewer is narrower (a node of an earlier version writes none),
		// never wider.
		return fmt.Errorf("a node may not widen the hosts agent %s's open let its sandbox reach (sandbox_net)", rec.ID)
	case (live.Workspace == nil) != (rec.Workspace == nil):
		// An agent is opened on a repository by its claim, or not at
		// all: a workspace a node added would name what the relay lets
		// it read and write of the repositories, and where a fetch lands.
		return fmt.Errorf("a node may not give agent %s a repository or take its repository away: only its open does", rec.ID)
	case live.Workspace != nil && (rec.Workspace.Repo != live.Workspace.Repo || rec.Workspace.Bundle != live.Workspace.Bundle ||
		rec.Workspace.Source != live.Workspace.Source):
		// What the relay lets the node read of the repositories, and the
		// caller's repository a fetch writes the agent's work into. (The
		// branch is the node's to name; a fetch lands on the agent's own
		// whatever it says.)
		return fmt.Errorf("a node may not change the repository, bundle or source agent %s is opened from", rec.ID)
	case rec.EventsBefore != live.EventsBefore || rec.TurnsBefore != live.TurnsBefore || !sameUsage(rec.UsageBefore, live.UsageBefore):
		// Where the id's earlier lives ended and what they used: the
		// claim's, which a new life numbers on from and is held to.
		return fmt.Errorf("a node may not change what agent %s's claim carries of its earlier lives (events_before, turns_before, usage_before)", rec.ID)
	case live.Policy != nil:
		a, _ := json.Marshal(live.Policy)
		b, _ := json.Marshal(rec.Policy)
		if !bytes.Equal(a, b) {
			return fmt.Errorf("a node may not change agent %s's policy", rec.ID)
		}
	}
	return nil
}

// sameUsage says whether a and b are the same use (both none, or equal).
func sameUsage(a, b *schemas.Usage) bool {
	switch {
	case a == nil || b == nil:
		return a == b
	case (a.CostUSD == nil) != (b.CostUSD == nil):
		return false
	case a.CostUSD != nil && *a.CostUSD != *b.CostUSD:
		return false
	}
	x, y := *a, *b
	x.CostUSD, y.CostUSD = nil, nil
	return x == y
}

// recordHeaders reads a record write's headers: the revision it expects
// (required: every record write is a compare-and-set) and whether it
// deletes.
func recordHeaders(h nats.Header) (expected uint64, del bool, err error) {
	seen := false
	for k, v := range h {
		switch {
		case len(v) != 1:
			return 0, false, fmt.Errorf("header %s appears %d times", k, len(v))
		case k == jetstream.ExpectedLastSubjSeqHeader:
			if expected, err = strconv.ParseUint(v[0], 10, 64); err != nil {
				return 0, false, fmt.Errorf("header %s is not a revision", k)
			}
			seen = true
		case k == "KV-Operation" && v[0] == "DEL":
			del = true
		default:
			return 0, false, fmt.Errorf("header %s may not be set by a node", k)
		}
	}
	if !seen {
		return 0, false, fmt.Errorf("a record write must say the revision it replaces (%s)", jetstream.ExpectedLastSubjSeqHeader)
	}
	return expected, del, nil
}

// beat writes or removes the node's own entry in the nodes bucket.
func (r *Relay) beat(ctx context.Context, m *nats.Msg) {
	node, _, ok := r.from(m)
	if !ok {
		return
	}
	h := nats.Header{}
	for k, v := range m.Header {
		if k != "KV-Operation" || len(v) != 1 || v[0] != "DEL" {
			r.refuse(m, node, "", fmt.Errorf("header %s may not be set by a node", k))
			return
		}
		h.Set("KV-Operation", "DEL")
	}
	if len(h) == 0 {
		if len(m.Data) > schemas.MaxNodeRecordBytes {
			r.refuse(m, node, "", fmt.Errorf("node %s's heartbeat is %d bytes; a node record is at most %d bytes (schemas.MaxNodeRecordBytes)", node, len(m.Data), schemas.MaxNodeRecordBytes))
			return
		}
		var rec schemas.NodeRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil || rec.Name != node {
			r.refuse(m, node, "", fmt.Errorf("a heartbeat must be the node record of %s", node))
			return
		}
		if err := schemas.ValidNodeLabels(rec.Labels); err != nil {
			r.refuse(m, node, "", fmt.Errorf("node %s's heartbeat: %w", node, err))
			return
		}
		m.Data = relayed(m.Data)
	}
	r.nc.PublishMsg(&nats.Msg{Subject: "$KV." + schemas.NodesBucket + "." + node, Reply: m.Reply, Header: h, Data: m.Data})
}

// relayed is a node record, a JSON object, saying it was written through
// the relay (schemas.NodeRecord.Relayed): the key is added last, so it
// stands over one the node sent, and nothing else of the node's is
// changed (a field this version does not know included).
func relayed(rec []byte) []byte {
	rec = bytes.TrimRight(rec, " \t\r\n")
	end := len(rec) - 1
	out := append(slices.Clip(rec[:end]), `,"relayed":true}`...)
	return out
}

// get answers an agent's record to the node it names; to any other node
// it is not found, so a node learns nothing of another's agents here.
func (r *Relay) get(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	e, err := r.agents.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		replyJSON(r.nc, m.Reply, schemas.RelayEntry{})
	case err != nil:
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "read agent %s: %v", id, err)})
	default:
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Node != node {
			replyJSON(r.nc, m.Reply, schemas.RelayEntry{})
			return
		}
		replyJSON(r.nc, m.Reply, schemas.RelayEntry{Found: true, Revision: e.Revision(), Value: e.Value()})
	}
}

// owned answers the records the node owns, by id: a page that fits half
// a message when the node asks for pages (a node's records grow with
// every agent it ran that kept one), or all of them to a node of an
// earlier version, which asks with nothing.
func (r *Relay) owned(ctx context.Context, m *nats.Msg) {
	node, _, ok := r.from(m)
	if !ok {
		return
	}
	var req schemas.RelayOwnedRequest
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &req); err != nil {
			replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err)})
			return
		}
	}
	r.mu.Lock()
	var ids []string
	for id, owner := range r.owners {
		if owner == node && id > req.After {
			ids = append(ids, id)
		}
	}
	r.mu.Unlock()
	slices.Sort(ids)
	rep := schemas.RelayOwnedReply{Records: []schemas.RelayEntry{}}
	room, size, last := int(r.nc.MaxPayload())/2, 64, ""
	if req.Max > 0 {
		room = int(min(req.Max, r.nc.MaxPayload())) / 2
	}
	for _, id := range ids {
		e, err := r.agents.Get(ctx, id)
		if err != nil {
			continue
		}
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Node != node {
			continue
		}
		n := len(e.Value()) + 64
		if req.Paged && len(rep.Records) > 0 && size+n > room {
			rep.Next = last
			break
		}
		size, last = size+n, id
		rep.Records = append(rep.Records, schemas.RelayEntry{Found: true, Revision: e.Revision(), Value: e.Value()})
	}
	replyJSON(r.nc, m.Reply, rep)
}

// last answers the last stored event number of each agent the node
// owns, and how its stream ends.
func (r *Relay) last(ctx context.Context, m *nats.Msg) {
	node, _, ok := r.from(m)
	if !ok {
		return
	}
	var req schemas.RelayLastRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err)})
		return
	}
	if len(req.Agents) > schemas.MaxRelayLast {
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid,
			"a last request names %d agents; a node asks of at most %d at once (schemas.MaxRelayLast)", len(req.Agents), schemas.MaxRelayLast)})
		return
	}
	rep := schemas.RelayLastReply{Last: map[string]uint64{}, Tails: map[string]schemas.Tail{}}
	for _, id := range req.Agents {
		if schemas.ValidID(id) != nil || !r.ownsNow(ctx, node, id) {
			continue
		}
		t, err := tailOf(ctx, r.nc, r.events, id)
		if err != nil {
			replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "read agent %s's last event: %v", id, err)})
			return
		}
		rep.Last[id], rep.Tails[id] = t.Last, t
	}
	replyJSON(r.nc, m.Reply, rep)
}

// hello tells a starting node whether its name is taken and how often
// it must beat.
func (r *Relay) hello(ctx context.Context, m *nats.Msg) {
	node, _, ok := r.from(m)
	if !ok {
		return
	}
	st, err := r.nodes.Status(ctx)
	if err != nil {
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "read %s: %v", schemas.NodesBucket, err)})
		return
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// On the node's door: the reply comes under the node's own reply
	// prefix, where its credentials may publish anything, and a flood
	// there must cut its door, not the relay's connection.
	_, err = client.RequestNode(pctx, r.doors.conn(node), node, schemas.ControlSubject(node, schemas.VerbList), []byte(`{}`))
	rep := schemas.RelayHelloReply{NameTaken: err == nil, NodeTTLMS: st.TTL().Milliseconds(), TakesAcked: true, Instance: entryInstance(ctx, r.nodes, node), Grants: true}
	if !rep.NameTaken {
		rep.MCP = r.mcpGrant(ctx, node)
	}
	replyJSON(r.nc, m.Reply, rep)
}

// grant tells a running node its way to the coordinator's MCP endpoint as
// it is now: a coordinator restarted since the node's hello may listen
// elsewhere, or have another token (or one where it had none), and the
// key the node was given then makes tokens the endpoint refuses.
func (r *Relay) grant(ctx context.Context, m *nats.Msg) {
	node, _, ok := r.from(m)
	if !ok {
		return
	}
	replyJSON(r.nc, m.Reply, schemas.RelayGrantReply{MCP: r.mcpGrant(ctx, node)})
}

// mcpGrant is node's way to the coordinator's MCP endpoint: its address
// and the node's key, or nil when the endpoint has no token (or there is
// none). Only node's own credentials publish under its relay subjects,
// so the key reaches that node alone.
func (r *Relay) mcpGrant(ctx context.Context, node string) *schemas.MCPGrant {
	if r.mcp == nil {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, mcpGrantWait)
	url, token := r.mcp(mctx)
	cancel()
	if url == "" || token == "" {
		return nil
	}
	return &schemas.MCPGrant{URL: url, Key: schemas.NodeKey(token, node)}
}

// entryInstance is the life whose heartbeat nodes holds for node, or ""
// when it holds none (or cannot be read).
func entryInstance(ctx context.Context, nodes jetstream.KeyValue, node string) string {
	e, err := nodes.Get(ctx, node)
	if err != nil {
		return ""
	}
	var rec schemas.NodeRecord
	json.Unmarshal(e.Value(), &rec)
	return rec.Instance
}

// mcpGrantWait bounds how long a hello or a grant waits for the
// coordinator's MCP endpoint to be listening (a node that joins while the
// coordinator starts).
const mcpGrantWait = 5 * time.Second

// refuse answers a write the node may not make with a final JetStream
// error, and logs it once per node and agent.
func (r *Relay) refuse(m *nats.Msg, node, id string, err error) {
	if _, op, _, ok := schemas.ParseRelaySubject(m.Subject); ok {
		r.metrics.Refused(op)
	}
	r.warn(node+"/"+id, "refused a node's write", "node", node, "agent", id, "subject", m.Subject, "err", err)
	replyJSON(r.nc, m.Reply, pubAckError(schemas.RelayRefused, 0, err.Error()))
}

func (r *Relay) warn(key, msg string, args ...any) {
	node, _, _ := strings.Cut(key, "/")
	now := time.Now()
	r.mu.Lock()
	seen := r.warned[key]
	if len(r.warned) > 10000 {
		clear(r.warned)
	}
	w := r.warnings[node]
	if w == nil || now.Sub(w.start) >= warnWindow {
		if len(r.warnings) > 10000 {
			clear(r.warnings)
		}
		if w != nil && w.held > 0 {
			defer r.log.Warn("refusals of a node's writes were not logged", "node", node, "count", w.held, "within", warnWindow)
		}
		w = &warnings{start: now}
		r.warnings[node] = w
	}
	say, hold := false, false
	switch {
	case seen:
	case w.said < warnsPerWindow:
		w.said++
		say = true
		r.warned[key] = true // a line held back is not taken for said
	default:
		hold = w.held == 0
		w.held++
	}
	r.mu.Unlock()
	if say {
		r.log.Warn(msg, args...)
	}
	if hold {
		r.log.Warn("more refusals of the node's writes are not logged for a while: it has had its share of lines; the relay's count of refusals has them all", "node", node, "lines", warnsPerWindow, "within", warnWindow)
	}
}

// warnings is what the relay has logged of one node's refusals within a
// window: a node naming thousands of made-up agents would otherwise have
// a line logged for each.
type warnings struct {
	start      time.Time
	said, held int
}

// A node has at most warnsPerWindow lines of the relay's log within
// warnWindow; the rest are counted, and the count logged after.
const (
	warnsPerWindow = 20
	warnWindow     = time.Minute
)

// pubAckError is a JetStream publish acknowledgement carrying an error,
// which a node's JetStream client reads as an API error.
func pubAckError(code int, errCode jetstream.ErrorCode, description string) any {
	type apiError struct {
		Code        int                 `json:"code"`
		ErrorCode   jetstream.ErrorCode `json:"err_code,omitempty"`
		Description string              `json:"description"`
	}
	return struct {
		Error apiError `json:"error"`
	}{apiError{code, errCode, description}}
}

func replyJSON(nc *nats.Conn, reply string, v any) {
	b, _ := json.Marshal(v)
	if err := nc.Publish(reply, b); errors.Is(err, nats.ErrMaxPayload) {
		// Dropped, the node would wait out its request for an answer
		// that never comes.
		b, _ = json.Marshal(schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInternal, "the relay's answer is %d bytes, more than a message of this fabric holds (%d)", len(b), nc.MaxPayload())})
		nc.Publish(reply, b)
	}
}

// tailOf reads how an agent's stream ends.
func tailOf(ctx context.Context, nc *nats.Conn, stream jetstream.Stream, id string) (schemas.Tail, error) {
	t, _, err := client.StreamTail(ctx, nc, stream, id)
	return t, err
}

// budget answers the budget of an agent the node owns (none for another's).
func (r *Relay) budget(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	switch owns, err := r.owns(ctx, node, id); {
	case err != nil:
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "%v", err)})
		return
	case !owns:
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeForbidden, "node %s was not given agent %s", node, id)})
		return
	}
	budgets, err := r.js.KeyValue(ctx, schemas.BudgetsBucket)
	if err != nil {
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.BudgetsBucket, err)})
		return
	}
	// The node's labels as its entry advertises them, not as it might
	// say: a label's budget holds a node that carries it.
	var rec schemas.NodeRecord
	if nodes, err := r.js.KeyValue(ctx, schemas.NodesBucket); err == nil {
		if e, err := nodes.Get(ctx, node); err == nil {
			json.Unmarshal(e.Value(), &rec)
		}
	}
	a, err := schemas.AllowanceOf(id, node, rec.Instance, schemas.LabelsOf(rec.Labels), func(key string) ([]byte, bool, error) {
		return client.BudgetValue(ctx, budgets, key)
	})
	if err != nil {
		replyJSON(r.nc, m.Reply, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeOf(err), "%v", err)})
		return
	}
	replyJSON(r.nc, m.Reply, a)
}
