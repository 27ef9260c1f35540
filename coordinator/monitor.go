package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// MonitorConfig configures the node-loss monitor.
type MonitorConfig struct {
	Conn *nats.Conn
	// Name is what the monitor's events carry as their producer; "coordinator"
	// when empty.
	Name string
	// Grace is how long after starting the monitor waits before it takes
	// for lost the nodes it has not heard from since it started (their
	// entries written before, or gone while no monitor ran); 3× the bucket
	// TTL when zero. A node heard from since the start is lost as soon as
	// its entry goes.
	Grace time.Duration
	// Disconnect, when set, closes the connections a node's life (its
	// record's instance; those of an earlier version's node made before
	// its last heartbeat) has to the coordinator's own server (the
	// embedded one), before the node's agents are closed: what the server
	// has not read of them, events the node sent before it was lost that
	// a link coming back would deliver, is dropped with them, not stored
	// after the close (broker.DisconnectNode).
	Disconnect func(node, instance string, before time.Time) int
	// ChunksIdle is how long the chunks of a bundle no object names (its
	// sender was killed mid-send) may go without another before they are
	// removed from the repositories' store; ChunksEvery how often the
	// store is looked at. defaultChunksIdle and defaultChunksEvery when
	// zero.
	ChunksIdle, ChunksEvery time.Duration
	// ClaimsEvery is how often the monitor ends the claims of opens that
	// no node took up and no open could still be making (their callers
	// went before their nodes heard of them: client.EndClaim);
	// defaultClaimsEvery when zero.
	ClaimsEvery time.Duration
	// Relay, when set, says when the relay's connection was last lost
	// (zero if never) and whether it is away now. Nodes confined to the
	// relay write their heartbeats through it (their records say
	// relayed): while it is away their entries expire though they live
	// (one node's flood can have the server cut the relay's connection as
	// a slow consumer). So no such node is taken for lost from an expiry
	// while the relay is away or within a TTL of its loss: it is judged at
	// a sweep once the relay has been back for a TTL, unless it checks in
	// again. Nodes that write their own heartbeats are judged as ever.
	Relay func() (lost time.Time, away bool)
	// Now is the monitor's clock; time.Now when nil. A monitor that finds
	// it was held up past a node TTL between two of its rounds (its
	// process stopped, its machine asleep) gives every node the grace
	// period, as at a start: the nodes could not beat meanwhile either.
	Now func() time.Time

	Logger *slog.Logger
}

// Monitor watches the nodes' heartbeats. When a node's entry expires (or
// it leaves), the agents its records still call live are lost: each
// record is marked dead with a compare-and-set, and each stream is closed
// with an error naming the node, a cancelled result for an open turn, and
// status dead. Several coordinators may run one each; the compare-and-set
// decides which closes an agent.
type Monitor struct {
	cfg   MonitorConfig
	log   *slog.Logger
	js    jetstream.JetStream
	ready chan struct{}
	// unfinished are the agents whose close the monitor began and could
	// not finish (a publish failed): tried again each second. Run's alone.
	unfinished map[string]bool
}

// NewMonitor checks cfg.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if cfg.Conn == nil {
		return nil, errors.New("the monitor needs a NATS connection")
	}
	if cfg.Name == "" {
		cfg.Name = schemas.CloserName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	return &Monitor{cfg: cfg, log: cfg.Logger.With("component", "monitor"), js: js, ready: make(chan struct{}), unfinished: map[string]bool{}}, nil
}

// Ready is closed once the monitor watches the heartbeats.
func (m *Monitor) Ready() <-chan struct{} { return m.ready }

// Run watches until ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	var sweeping sync.WaitGroup
	defer sweeping.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sweeping.Go(func() { m.sweepChunks(ctx) })
	sweeping.Go(func() { m.sweepClaims(ctx) })
	nodes, err := m.js.KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	agents, err := m.js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	stream, err := m.js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	st, err := nodes.Status(ctx)
	if err != nil {
		return err
	}
	ttl, grace := st.TTL(), m.cfg.Grace
	if grace == 0 {
		grace = 3 * ttl
	}
	// relayAway reports when the relay's connection was last lost, if it
	// is away now or was within a TTL of now: the nodes' entries may then
	// have expired for want of it.
	relayAway := func(now time.Time) (time.Time, bool) {
		if m.cfg.Relay == nil {
			return time.Time{}, false
		}
		lost, away := m.cfg.Relay()
		return lost, away || (!lost.IsZero() && now.Sub(lost) < ttl)
	}
	// Made again at once when the server restarts under it.
	w, err := client.WatchAllKeys(ctx, m.cfg.Conn, nodes)
	if err != nil {
		return err
	}
	defer w.Stop()
	// A node heard from since the monitor started is lost the moment its
	// entry expires or is removed. A node whose entry was there before
	// (written before this coordinator started) may be reconnecting to a
	// restarted server, so its expiry waits for the grace period, as do
	// nodes whose entries expired while no monitor ran: after it, the
	// nodes that have not come back are lost, and from then on every
	// expiry is.
	permits, err := m.js.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", schemas.PermitsBucket, err)
	}
	// What waits for an answer, from a watch of the bucket: what it holds
	// is read once, not at every round (an agent keeps its latest
	// answered requests for days).
	pw, err := client.WatchAllKeys(ctx, m.cfg.Conn, permits)
	if err != nil {
		return err
	}
	defer pw.Stop()
	waiting := map[string]waitingPermit{}
	overdue := time.NewTicker(time.Second)
	defer overdue.Stop()
	started := time.Now()
	heardSince := started        // an entry made after it is a node heard from
	present := map[string]bool{} // node -> heard from since the start
	// Each node's last heartbeat: the connections of its life are the
	// ones a loss closes.
	lastPut := map[string]beat{}
	settled := false
	sweep := time.NewTimer(grace)
	defer sweep.Stop()
	// The connection came back, perhaps to a server restarted after
	// being away longer than the entries' TTL, which expires every entry
	// as it starts though the nodes are alive and reconnecting: from
	// here, as at a start, a node is lost once it has not come back
	// within the grace period.
	//
	// A node is heard from again by an entry made after the connection
	// was lost (lost, from the watch): one made on the server that went
	// came before the outage, and its expiry there may be the outage's.
	regrace := func(lost time.Time, what string) {
		m.log.Info(what+": nodes not heard from within the grace period will be lost", "grace", grace)
		started, heardSince, settled = time.Now(), lost, false
		clear(present)
		sweep.Reset(grace)
	}
	// held reports whether the monitor was held up past a TTL (and the
	// second between its looks) since it last looked, and then
	// gives every node the grace period: a coordinator stopped or asleep
	// that long (its embedded server with it, or a link) saw entries
	// expire that the nodes could not renew, and judged them as it woke.
	// The wall clock is read too, as the monotonic one stands still while
	// a machine sleeps.
	clock := m.cfg.Now
	if clock == nil {
		clock = time.Now
	}
	awake := clock()
	held := func() bool {
		now := clock()
		gap := max(now.Sub(awake), now.Round(0).Sub(awake.Round(0)))
		awake = now
		if gap < ttl+time.Second {
			return false // the looks come a second apart: with a TTL of 1s a gap of one is theirs
		}
		// Heard from is written from now on: an entry made before, even
		// since the last look, may expire for the hold alone.
		regrace(time.Now(), fmt.Sprintf("the coordinator was held up %s (stopped or asleep), past the nodes' TTL", gap.Round(time.Millisecond)))
		return true
	}
	close(m.ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case lost := <-w.Reconnected():
			regrace(lost, "connected again")
		case now := <-overdue.C:
			held()
			m.finishUnfinished(ctx, agents, stream)
			m.denyOverdue(ctx, permits, waiting, now, func(node string) bool { _, ok := present[node]; return !ok && (settled || now.Sub(started) > grace) })
		case <-pw.Reconnected():
			// Perhaps to a server that lost what the watch had passed
			// on, where revisions start again below it: what waits is
			// read afresh.
			m.readWaiting(ctx, permits, waiting)
		case e, ok := <-pw.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("the permission requests' watch ended")
			}
			if e != nil {
				noteWaiting(waiting, e.Key(), e.Operation(), e.Value())
			}
		case <-sweep.C:
			if held() {
				continue // the sweep, due while the monitor was held, is a grace later
			}
			if _, away := relayAway(time.Now()); away {
				// Nodes that beat through the relay wait until it has been
				// back a while; the others are judged.
				m.sweep(ctx, nodes, agents, stream, func(node string) bool { _, ok := present[node]; return !ok && !lastPut[node].relayed }, "was lost", beat{})
				sweep.Reset(grace)
				continue
			}
			settled = true
			// No connection closed: the server these nodes wrote their
			// entries to before the start is not this one's.
			m.sweep(ctx, nodes, agents, stream, func(node string) bool { _, ok := present[node]; return !ok }, "was lost", beat{})
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil // it ended with ctx, which the select saw second
				}
				return errors.New("the node watch ended")
			}
			if e == nil {
				continue
			}
			select {
			case lost := <-w.Reconnected(): // said before the entries of the watch made again
				regrace(lost, "connected again")
			default:
			}
			held()
			node := e.Key()
			if e.Operation() == jetstream.KeyValuePut {
				present[node] = present[node] || e.Created().After(heardSince)
				var rec struct {
					Instance string `json:"instance"`
					Relayed  bool   `json:"relayed"`
				}
				json.Unmarshal(e.Value(), &rec)
				lastPut[node] = beat{at: e.Created(), instance: rec.Instance, relayed: rec.Relayed}
				continue
			}
			heard, known := present[node]
			delete(present, node)
			if _, away := relayAway(time.Now()); away && lastPut[node].relayed && e.Operation() != jetstream.KeyValueDelete && (settled || (known && heard)) {
				// Perhaps for want of the relay it beats through: the node
				// is judged at a sweep once the relay has been back a
				// while, unless it checks in again.
				m.log.Warn("a node's entry expired while the relay's connection was away, or soon after; it has the grace period to check in again", "node", node)
				settled = false
				sweep.Reset(grace)
				continue
			}
			if e.Operation() == jetstream.KeyValueDelete {
				// A node that stops removes its entry itself, having
				// closed its agents: it left, it was not lost. What it
				// could not close is closed as a loss all the same.
				m.log.Info("node left", "node", node)
			} else if settled || (known && heard) {
				m.log.Warn("node lost", "node", node)
			}
			switch {
			case e.Operation() == jetstream.KeyValueDelete:
				m.sweep(ctx, nodes, agents, stream, func(n string) bool { return n == node }, "stopped", beat{})
			case settled || (known && heard):
				m.sweep(ctx, nodes, agents, stream, func(n string) bool { return n == node }, "was lost", lastPut[node])
			}
		}
	}
}

// waitingPermit is a permission request waiting for its answer: the node
// that asked, and its deadline.
type waitingPermit struct {
	node     string
	deadline time.Time
}

// noteWaiting updates waiting with an entry of the permits bucket: a
// request without an answer and with a deadline is kept, anything else
// under its key dropped.
func noteWaiting(waiting map[string]waitingPermit, key string, op jetstream.KeyValueOp, value []byte) {
	var rec schemas.PermitRecord
	if op != jetstream.KeyValuePut || json.Unmarshal(value, &rec) != nil || rec.Answer != nil || rec.Deadline == 0 {
		delete(waiting, key)
		return
	}
	waiting[key] = waitingPermit{node: rec.Node, deadline: time.Unix(0, int64(rec.Deadline*1e9))}
}

// readWaiting makes waiting what the bucket holds now; it is left as it
// was when the bucket cannot be read.
func (m *Monitor) readWaiting(ctx context.Context, permits jetstream.KeyValue, waiting map[string]waitingPermit) {
	now := map[string]waitingPermit{}
	if err := client.ReadBucket(ctx, permits, func(e jetstream.KeyValueEntry) { noteWaiting(now, e.Key(), e.Operation(), e.Value()) }); err != nil {
		m.log.Warn("could not read the permission requests waiting", "err", err)
		return
	}
	clear(waiting)
	maps.Copy(waiting, now)
}

// denyOverdue answers the permission requests whose deadline has passed
// and whose node is gone: a node answers its own at their deadline, and a
// node lost (or stopped for good) never will, so the request would wait
// in every list forever. The answer is a denial by the coordinator; the
// record stays, answered, so a late answer is told it came too late.
// waiting is what the monitor knows waits; each is read again before it
// is answered.
func (m *Monitor) denyOverdue(ctx context.Context, permits jetstream.KeyValue, waiting map[string]waitingPermit, now time.Time, gone func(node string) bool) {
	for key, w := range waiting {
		if now.Before(w.deadline) || !gone(w.node) {
			continue
		}
		e, err := permits.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			delete(waiting, key)
			continue
		}
		if err != nil {
			continue // tried again at the next round
		}
		var rec schemas.PermitRecord
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Answer != nil || rec.Deadline == 0 ||
			now.Before(time.Unix(0, int64(rec.Deadline*1e9))) || !gone(rec.Node) {
			noteWaiting(waiting, key, e.Operation(), e.Value())
			continue
		}
		b, _ := json.Marshal(schemas.Answered(rec, schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "coordinator", At: float64(now.UnixNano()) / 1e9,
			Message: fmt.Sprintf("nobody answered by the request's deadline, and node %s, which asked, is gone; the request was denied", rec.Node)}))
		if _, err := permits.Update(ctx, key, b, e.Revision()); err == nil {
			delete(waiting, key)
			m.log.Info("denied an overdue permission request of a node that is gone", "agent", rec.AgentID, "request", rec.RequestID, "node", rec.Node)
		}
	}
}

// sweep closes the live agents of the nodes lost reports.
// how says what became of the node ("was lost", "stopped"); the
// connections of the life of its last beat are closed first (none when
// last is the zero beat).
func (m *Monitor) sweep(ctx context.Context, nodes, agents jetstream.KeyValue, stream jetstream.Stream, lost func(node string) bool, how string, last beat) {
	// Read in one pass, and acted on after: most records are dead and
	// not the lost node's.
	type found struct {
		id  string
		rec schemas.AgentRecord
		rev uint64
	}
	var todo []found
	err := client.ReadBucket(ctx, agents, func(e jetstream.KeyValueEntry) {
		var rec schemas.AgentRecord
		if json.Unmarshal(e.Value(), &rec) != nil || (rec.Status == schemas.StatusDead && rec.Closing == nil) {
			return
		}
		if rec.Status == schemas.StatusDead || lost(rec.Node) {
			todo = append(todo, found{e.Key(), rec, e.Revision()})
		}
	})
	if err != nil {
		return
	}
	cut := map[string]bool{} // the nodes whose connections were closed in this sweep
	for _, f := range todo {
		id, rec, rev := f.id, f.rec, f.rev
		if rec.Status == schemas.StatusDead && rec.Closing != nil {
			// Whatever its node: the record says dead, and the stream
			// must too.
			m.finish(ctx, agents, stream, rec, rev)
			continue
		}
		if rec.Status == schemas.StatusDead || !lost(rec.Node) {
			continue
		}
		if untakenClaim(rec) {
			// The node never took the agent up: there is no life to
			// close. The client that claimed it gives it back when its
			// open fails; one that went too leaves it stale, and it goes.
			if staleClaim(rec) {
				client.EndClaim(ctx, m.js, rec, rev)
			}
			continue
		}
		if err := m.closeLost(ctx, nodes, agents, stream, rec, rev, how, last, cut); err != nil {
			m.log.Warn("cannot close a lost agent", "agent", id, "node", rec.Node, "err", err)
			m.unfinished[id] = true // its record may keep the close begun
		}
	}
}

// beat is what the monitor knows of a node's last heartbeat: when it was
// stored, and the node's life instance it named.
type beat struct {
	at       time.Time
	instance string
	relayed  bool // written through the relay (schemas.NodeRecord.Relayed)
}

// closeLost marks one agent dead and closes its stream, unless its node
// is back. The order is what makes a node that comes back and the
// monitor agree: the record (its revision, rev) was read before the
// node's entry is looked for, and a node back beats before it writes its
// agents' records; so either the entry is seen here, or the node's
// write, after it, finds the record dead, or this update finds the
// record changed and leaves it.
func (m *Monitor) closeLost(ctx context.Context, nodes, agents jetstream.KeyValue, stream jetstream.Stream, rec schemas.AgentRecord, rev uint64, how string, last beat, cut map[string]bool) error {
	if _, err := nodes.Get(ctx, rec.Node); err == nil {
		m.log.Info("a node taken for lost is back; its agent is left to it", "agent", rec.ID, "node", rec.Node)
		return nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	if m.cfg.Disconnect != nil && !last.at.IsZero() && !cut[rec.Node] {
		// Before the tail is read: what the node's connections still
		// held is either stored by now or dropped with them.
		cut[rec.Node] = true
		if n := m.cfg.Disconnect(rec.Node, last.instance, last.at); n > 0 {
			m.log.Info("closed the connections of a node taken for lost", "node", rec.Node, "connections", n)
			// A connection closed mid-read finishes the buffer it read,
			// into the stream's queue: let it be stored before the tail
			// is read.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(disconnectSettle):
			}
		}
	}
	tail, err := tailOf(ctx, m.cfg.Conn, stream, rec.ID)
	if err != nil {
		return err
	}
	dead := schemas.CloseLost(rec, tail, "node "+rec.Node+" "+how, m.cfg.Name)
	b, _ := json.Marshal(dead)
	rev, err = agents.Update(ctx, rec.ID, b, rev)
	if err != nil {
		return nil // its owner or another coordinator wrote first
	}
	return m.storeClosing(ctx, agents, dead, rev, tail.Last, false)
}

// storeClosing stores the closing events of the close dead keeps (its
// record at revision rev) numbered past stored, the last stored of the
// agent's events, and then writes the record without the close. A
// finishing close may find another coordinator storing the same events.
func (m *Monitor) storeClosing(ctx context.Context, agents jetstream.KeyValue, dead schemas.AgentRecord, rev, stored uint64, finishing bool) error {
	n, events, err := dead.ClosingEvents()
	if err != nil {
		return err
	}
	for _, ev := range events {
		n++
		if n <= stored {
			continue // stored by the close that began it
		}
		env, err := schemas.Encode(ev)
		if err != nil {
			return err
		}
		msg := nats.NewMsg(schemas.EventSubject(dead.ID))
		msg.Data = env
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID(dead.ID, n))
		msg.Header.Set(schemas.HeaderNode, m.cfg.Name)
		msg.Header.Set(schemas.HeaderClosedFor, dead.Node)
		msg.Header.Set(schemas.HeaderTime, time.Now().UTC().Format(time.RFC3339Nano))
		ack, err := m.js.PublishMsg(ctx, msg)
		if err != nil {
			return err
		}
		if ack.Duplicate && !finishing {
			// Said, not mended: an event of the node's took the number
			// after the tail was read, which the node's lease and its
			// restart's check are there to rule out.
			m.log.Error("a closing event of a lost node's agent was taken for a copy: an event of the node's holds its number, and the agent's stream may not end with its death",
				"agent", dead.ID, "node", dead.Node, "event", n)
		}
	}
	done := dead
	done.Closing = nil
	b, _ := json.Marshal(done)
	// A later write (the id opened again) is the record's now.
	agents.Update(ctx, dead.ID, b, rev)
	m.log.Info("closed a lost node's agent", "agent", dead.ID, "node", dead.Node)
	return nil
}

// finish stores what is missing of a close a sweep began and did not
// finish (its coordinator stopped between the record and the events, or
// a publish failed): the record, at revision rev, keeps the close. One
// that fails is tried again each second.
func (m *Monitor) finish(ctx context.Context, agents jetstream.KeyValue, stream jetstream.Stream, dead schemas.AgentRecord, rev uint64) {
	delete(m.unfinished, dead.ID)
	_, _, err := dead.ClosingEvents()
	if err == nil && (dead.ClosedBy == "" || !strings.HasPrefix(dead.Closing.Why, "node "+dead.Node+" ")) {
		err = errors.New("it names no coordinator, or another node")
	}
	if err != nil {
		// Not a close a monitor wrote: a confined node's records go
		// through the relay, which lets none write one, but a node with
		// the fabric's rights could.
		m.log.Error("an agent's record keeps a close no coordinator wrote; nothing is made of it", "agent", dead.ID, "node", dead.Node, "closed_by", dead.ClosedBy, "err", err)
		return
	}
	tail, err := tailOf(ctx, m.cfg.Conn, stream, dead.ID)
	if err == nil && tail.Last == 0 && dead.Closing.From > 0 {
		// What the close followed is no longer stored: the agent's
		// events aged out of the stream (a close cut off for days), its
		// end with them, perhaps. Not stored again; the record drops it.
		tail.Last = dead.LastEvent
	}
	if err == nil {
		m.log.Warn("finishing a lost node's agent's close that was cut off", "agent", dead.ID, "node", dead.Node, "stored", tail.Last, "closes_at", dead.LastEvent)
		err = m.storeClosing(ctx, agents, dead, rev, tail.Last, true)
	}
	if err != nil {
		m.log.Warn("cannot finish a lost agent's close; trying again", "agent", dead.ID, "node", dead.Node, "err", err)
		m.unfinished[dead.ID] = true
	}
}

// finishUnfinished tries again the closes the monitor could not finish.
func (m *Monitor) finishUnfinished(ctx context.Context, agents jetstream.KeyValue, s jetstream.Stream) {
	for id := range m.unfinished {
		e, err := agents.Get(ctx, id)
		var rec schemas.AgentRecord
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			delete(m.unfinished, id)
		case err != nil:
			// Tried again at the next tick.
		case json.Unmarshal(e.Value(), &rec) != nil || rec.Status != schemas.StatusDead || rec.Closing == nil:
			delete(m.unfinished, id) // done, or not a close to finish
		default:
			m.finish(ctx, agents, s, rec, e.Revision())
		}
	}
}

// disconnectSettle is how long the monitor lets what a closed connection
// had read reach the stream.
const disconnectSettle = 250 * time.Millisecond

// untakenClaim reports whether rec is an open's claim its node has not
// taken up: a node's own record of an agent names its event log.
func untakenClaim(rec schemas.AgentRecord) bool {
	return rec.Status == schemas.StatusStarting && rec.EventLog == ""
}

// staleClaim reports whether an untaken claim is older than any open
// would take.
func staleClaim(rec schemas.AgentRecord) bool {
	return time.Since(time.Unix(int64(rec.CreatedAt), 0)) > schemas.OpenTimeout+time.Minute
}

// Defaults of MonitorConfig.ChunksIdle and ChunksEvery.
const (
	defaultChunksIdle  = 15 * time.Minute
	defaultChunksEvery = 5 * time.Minute
)

// sweepChunks removes, every ChunksEvery until ctx ends, the chunks in
// the repositories' store that no object names and that have had no new
// one for ChunksIdle: what a sender killed mid-send left (the object
// store removes a failed put's chunks only when the putter lives to see
// it fail). They would count against the store's bound for its 24 hours
// and refuse the retry of the very send they are part of. A put going on
// adds a chunk at least every few seconds; one that is whole is named by
// its object's metadata, written after its last chunk.
func (m *Monitor) sweepChunks(ctx context.Context) {
	idle := cmp.Or(m.cfg.ChunksIdle, defaultChunksIdle)
	everyTick(ctx, cmp.Or(m.cfg.ChunksEvery, defaultChunksEvery), func() {
		if n, err := m.removeOrphanChunks(ctx, idle); err != nil {
			m.log.Debug("could not look for orphaned chunks in the repositories' store", "err", err)
		} else if n > 0 {
			m.log.Info("removed the chunks of bundles whose sender stopped mid-send", "bundles", n)
		}
	})
}

// defaultClaimsEvery is MonitorConfig.ClaimsEvery's default.
const defaultClaimsEvery = time.Minute

// sweepClaims ends, every ClaimsEvery until ctx ends, the claims no node
// took up that are older than any open would take (client.EndClaim): one
// whose node lives was listed as starting for good (a node's loss ends
// its own, sweep).
func (m *Monitor) sweepClaims(ctx context.Context) {
	everyTick(ctx, cmp.Or(m.cfg.ClaimsEvery, defaultClaimsEvery), func() {
		agents, err := m.js.KeyValue(ctx, schemas.AgentsBucket)
		if err != nil {
			return
		}
		type stale struct {
			rec schemas.AgentRecord
			rev uint64
		}
		var todo []stale
		client.ReadBucket(ctx, agents, func(e jetstream.KeyValueEntry) {
			var rec schemas.AgentRecord
			if json.Unmarshal(e.Value(), &rec) == nil && untakenClaim(rec) && staleClaim(rec) {
				todo = append(todo, stale{rec, e.Revision()})
			}
		})
		for _, c := range todo {
			// At its revision: a node taking it up meanwhile keeps it.
			if err := client.EndClaim(ctx, m.js, c.rec, c.rev); err == nil {
				m.log.Info("ended the claim of an open no node took up", "agent", c.rec.ID)
			}
		}
	})
}

// everyTick runs fn every d until ctx ends.
func everyTick(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// removeOrphanChunks removes the chunks no object of the repositories'
// store names that have had no new one for idle, and returns of how many
// puts.
func (m *Monitor) removeOrphanChunks(ctx context.Context, idle time.Duration) (int, error) {
	stream, err := m.js.Stream(ctx, "OBJ_"+schemas.ReposBucket)
	if err != nil {
		return 0, err
	}
	prefix := "$O." + schemas.ReposBucket + ".C."
	// The chunks' subjects first, then the objects: an object made whole
	// between the two is named, and one made whole after is recent.
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil || len(info.State.Subjects) == 0 {
		return 0, err
	}
	obs, err := m.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return 0, err
	}
	named := map[string]bool{}
	objects, err := obs.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, err
	}
	for _, o := range objects {
		named[o.NUID] = true
	}
	removed := 0
	for subject := range info.State.Subjects {
		if named[strings.TrimPrefix(subject, prefix)] {
			continue
		}
		last, err := stream.GetLastMsgForSubject(ctx, subject)
		if err != nil || time.Since(last.Time) < idle {
			continue
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err == nil {
			removed++
		}
	}
	return removed, nil
}
