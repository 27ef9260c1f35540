package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// The relay stores an agent's events in their numbers' order and nothing
// else: per agent it knows the number it expects next and the numbers
// the stream has acknowledged, because it forwards each event under a
// reply subject of its own and hands JetStream's acknowledgement on to
// the node. So a copy of an old event is answered as a duplicate and never
// stored again, however long ago the original was; a number that skips
// ahead is refused; and nothing follows the dead status that ended a life
// until the agent is given a new one.

// sequence is what the relay knows of one agent's numbering.
type sequence struct {
	// next is the number the relay expects next: one past the last it
	// forwarded, or past the stream's last when it asked the stream.
	next uint64
	// stored is the highest number up to which every event is stored, as
	// acknowledged (or read from the stream); ahead holds numbers
	// acknowledged past it.
	stored uint64
	ahead  map[uint64]bool
	// flying counts the forwards of each number not yet acknowledged.
	flying map[uint64]int
	// dead says the stream holds the dead status that ended the agent's
	// last life, numbered death.
	dead  bool
	death uint64
	// turn is the highest turn stamped on an event forwarded or read.
	turn int
	// result is the highest turn whose result was forwarded or read: a
	// turn has one result, and a result counts in the fleet's spend, so
	// one of a turn that had its own, under a new number, is refused (a
	// number's retry is not: what was sent under it may not be stored).
	result int
	// unknown says the stream held none of the agent's current life when
	// the relay read it, and the relay has forwarded none since: its
	// events aged out (or it has sent none yet), so where its numbering
	// stands is the node's word (schemas.HeaderAcked), bounded by its
	// record.
	unknown bool
	// recorded is the last event number the agent's record said was
	// handed out when the relay first read it: what the node's word may
	// run ahead of, by a bound, however often the node writes its record
	// after.
	recorded uint64
}

// inflight is an event the relay forwarded and whose acknowledgement it
// waits for, to hand on to the node.
type inflight struct {
	agent  string
	n      uint64
	reply  string
	ends   bool // the event is a dead status
	at     time.Time
	turn   int    // the event's turn
	result bool   // the event is a result
	after  uint64 // the node's word taken with it: every event up to after is stored
	gen    uint64 // the relay's forwarding connection it went on (Relay.gen)
}

// ackWait is how long the relay keeps an inflight entry: past it, the
// node has given up on that acknowledgement and will send the event again.
const ackWait = 2 * time.Minute

// seq returns id's sequence, reading the stream's tail when the relay
// knows nothing of it yet. Called with r.mu held; it unlocks to read.
func (r *Relay) seq(ctx context.Context, id string) (*sequence, error) {
	if s, ok := r.seqs[id]; ok {
		return s, nil
	}
	r.mu.Unlock()
	t, rec, unknown, err := r.tail(ctx, id)
	r.mu.Lock()
	if err != nil {
		return nil, err
	}
	if s, ok := r.seqs[id]; ok { // another read got here first
		return s, nil
	}
	s := &sequence{next: t.Last + 1, stored: t.Last, ahead: map[uint64]bool{}, flying: map[uint64]int{}, dead: t.Dead, turn: t.Turn, result: resulted(t),
		unknown: unknown, recorded: rec.LastEvent}
	if t.Dead {
		s.death = t.Last
	}
	r.seqs[id] = s
	return s, nil
}

// refresh brings s up to the stream's tail: another relay, or the
// coordinator's node monitor, may have stored events since. Called with
// r.mu held; it unlocks to read.
func (r *Relay) refresh(ctx context.Context, id string, s *sequence) error {
	r.mu.Unlock()
	t, _, unknown, err := r.tail(ctx, id)
	r.mu.Lock()
	if err != nil {
		return err
	}
	s.unknown = s.unknown && unknown
	if t.Last >= s.next {
		s.next = t.Last + 1
	}
	if t.Last > s.stored {
		s.stored = t.Last
		s.dead, s.death = t.Dead, 0
		if t.Dead {
			s.death = t.Last
		}
	}
	s.turn = max(s.turn, t.Turn)
	s.result = max(s.result, resulted(t))
	return nil
}

// resulted is the highest turn that has its result, as far as a stream's
// tail t tells: its turn when its last event is that result, or the death
// that ended the life; else the turn before (a held turn's echo, a status
// idle or closed, an error come before the running turn's result).
func resulted(t schemas.Tail) int {
	if t.Result || t.Dead {
		return t.Turn
	}
	return max(t.Turn-1, 0)
}

// recordAhead bounds how far past what the relay has forwarded of an
// agent's events a confined node's record may say its numbering stands:
// events it numbered and has not sent yet (its outbox), turns it numbered
// that wait behind the running one.
const (
	recordEventsAhead = 4096
	recordTurnsAhead  = 4096
)

// holdNumbering holds what a confined node's record of agent id says of
// its numbering (last_event, turn) to what the relay has seen of it, or
// what its live record says, whichever is further, within
// recordEventsAhead and recordTurnsAhead: a new life's claim numbers on
// from them, so a node could otherwise push another node's next life of
// the id anywhere (past 2^64, where its numbers wrap). A record is never
// held below what its live record says: after a coordinator restart the
// relay may have seen none of an agent's events (they aged out).
func (r *Relay) holdNumbering(ctx context.Context, id string, live schemas.AgentRecord, rec *schemas.AgentRecord) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.seq(ctx, id)
	if err != nil {
		return err
	}
	rec.LastEvent = min(rec.LastEvent, max(s.next-1, live.LastEvent)+recordEventsAhead)
	rec.Turn = min(rec.Turn, max(s.turn, live.Turn)+recordTurnsAhead)
	return nil
}

// tail is where agent id's numbering stands: its stream's end, or, past
// it, the last number of the id's earlier lives its record carries (the
// stream's retention may have dropped their events; a new life numbers
// after them). rec is the agent's record as read; unknown says the stream
// holds none of the current life's events. Called without r.mu.
func (r *Relay) tail(ctx context.Context, id string) (t schemas.Tail, rec schemas.AgentRecord, unknown bool, err error) {
	t, _, err = client.StreamTail(ctx, r.nc, r.events, id)
	if err != nil {
		return t, rec, false, err
	}
	rec, ok, err := r.bucketRecord(ctx, id)
	if err != nil || !ok {
		return t, rec, false, err
	}
	unknown = t.Last <= rec.EventsBefore
	if rec.EventsBefore > t.Last {
		// Every number of those lives is as good as stored: they ended.
		t = schemas.Tail{Last: rec.EventsBefore, Turn: max(t.Turn, rec.TurnsBefore), Dead: true}
	}
	return t, rec, unknown, nil
}

// verdict is what the relay does with an event.
type verdict int

const (
	forward   verdict = iota // store it
	duplicate                // stored already: acknowledge it as a duplicate
	resume                   // store it, taking the node's word for what is stored before it
)

// admit decides event n of agent id, which node owns and whose record
// may say dead: forward it, answer it as a duplicate, or refuse it (an
// error that says why). acked, when claims, is the node's word for the
// agent's last event stored (schemas.HeaderAcked).
func (r *Relay) admit(ctx context.Context, node, id string, n uint64, env []byte, recordDead bool, acked uint64, claims bool) (verdict, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.seq(ctx, id)
	if err != nil {
		return 0, unsure{err}
	}
	if !recordDead && s.dead && n > s.stored {
		// The stream ended with the agent's death, and the watched view
		// of its record may not show that death yet (the node writes the
		// record before its last events): the bucket says whether this
		// is a new life.
		r.mu.Unlock()
		recordDead, err = r.bucketDead(ctx, id)
		r.mu.Lock()
		if err != nil {
			return 0, err
		}
	}
	if recordDead && !s.dead {
		// The coordinator may have closed the agent's stream itself (its
		// node was lost): the stream has the last word.
		if err := r.refresh(ctx, id, s); err != nil {
			return 0, unsure{err}
		}
	}
	if recordDead && s.dead && n > s.stored {
		p := schemas.NodePrincipal(node)
		t := schemas.Target{Agent: id, Owner: node, Ended: true}
		return 0, schemas.Decide(p, schemas.AccessStore, t).Err(p, fmt.Sprintf("store event %d of", n), t)
	}
	switch {
	case n == s.next:
		return forward, nil
	case n < s.next && n <= s.stored:
		return duplicate, nil
	case n < s.next && s.flying[n] > 0:
		return forward, nil // a retry of one in flight: the stream's duplicate window has it
	}
	// The relay's view may be behind the stream's.
	if err := r.refresh(ctx, id, s); err != nil {
		return 0, unsure{err}
	}
	switch {
	case n <= s.stored:
		return duplicate, nil
	case n < s.next, n == s.next:
		return forward, nil // a retry of one lost on its way
	}
	if from, to, lost := schemas.LostRange(env); lost && from == s.next && to == n-1 {
		return forward, nil // a node that lost its journal names what it lost
	}
	if s.unknown && claims {
		return r.resumeAged(ctx, node, id, s, n, acked)
	}
	if r.doubted[id] {
		// Its events in flight were lost with the relay's connection
		// (settle): its node is going back to the first of them.
		return 0, unsure{fmt.Errorf("event %d of agent %s: the relay's connection to the stream was lost with earlier ones on their way; send from %d", n, id, s.next)}
	}
	return 0, fmt.Errorf("event %d of agent %s does not follow its last stored event (%d): the relay stores each agent's events in order, the next number only", n, id, s.next-1)
}

// resumeAged decides event n of agent id, which does not follow what the
// relay knows of its numbering, when the stream holds none of the agent's
// current life: its events aged out, and the relay was started since. The
// node's word that every event up to acked is stored is taken for where
// the numbering stands (the verdict resume) when the agent's record says
// it lives on node and its life had numbered events when the relay first
// read it, and the word is within what that record said (plus the
// recordEventsAhead a record may run ahead); an event past acked+1 is sent
// again, the node sending what comes before it first. Nothing of s
// changes until the event is forwarded. Called with r.mu held; it unlocks
// to read.
func (r *Relay) resumeAged(ctx context.Context, node, id string, s *sequence, n, acked uint64) (verdict, error) {
	r.mu.Unlock()
	rec, ok, err := r.bucketRecord(ctx, id)
	r.mu.Lock()
	switch {
	case err != nil:
		return 0, err
	case !ok || rec.Node != node || rec.Status == schemas.StatusDead || !s.unknown || s.recorded <= rec.EventsBefore ||
		acked < s.stored || n <= acked || acked > s.recorded+recordEventsAhead:
		return 0, fmt.Errorf("event %d of agent %s does not follow its last stored event (%d), and the node's word that its last stored event is %d is not taken (its record said it numbered %d when the relay first read it): the relay stores each agent's events in order, the next number only", n, id, s.next-1, acked, s.recorded)
	case n > acked+1:
		return 0, unsure{fmt.Errorf("event %d of agent %s: the stream holds none of the agent's events past %d, and the node says %d is its last stored: send %d first", n, id, s.stored, acked, acked+1)}
	}
	return resume, nil
}

// forwarded records that event n of id, of node's, goes to the stream
// under token. It refuses, recording nothing, when the relay has learnt
// since it checked that the agent is another node's (a read of the bucket
// while deciding, at a life's end, the view lagging a reopen on another
// node, may have found it given to that node), and a result of a turn
// that has its result already, or of no turn.
func (r *Relay) forwarded(token, node string, f inflight) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.gen != r.gen {
		return unsure{errors.New("the relay's connection to the stream was lost as it decided")}
	}
	if owner, known := r.owners[f.agent]; known && owner != node {
		return notOwner(node, f.agent)
	}
	if f.result && f.turn < 1 {
		return fmt.Errorf("event %d of agent %s is a result of turn %d: turns are numbered from 1", f.n, f.agent, f.turn)
	}
	s := r.seqs[f.agent]
	if s == nil {
		return nil
	}
	if f.result && f.turn <= s.result && f.n >= s.next {
		return fmt.Errorf("event %d of agent %s is a result of turn %d, and turn %d has had its result: a turn ends once", f.n, f.agent, f.turn, s.result)
	}
	if f.after > 0 {
		// The node's word, taken (resumeAged): every event before it is
		// stored.
		s.stored = max(s.stored, f.after)
	}
	if f.n >= s.next {
		s.next = f.n + 1
	}
	s.unknown = false
	s.turn = max(s.turn, f.turn)
	if f.result {
		s.result = max(s.result, f.turn)
	}
	s.flying[f.n]++
	r.inflight[token] = f
	delete(r.doubted, f.agent)
	return nil
}

// The relay forwards an agent's events one after another without waiting
// for each to be stored, on one connection, in order: the server takes a
// prefix of them, so when the connection is lost, what is lost with it is
// the last ones sent. Forwarding the next on a new connection would store
// it past those, and a stream that ends past a hole reads as gapless: the
// relay's tail (and the node's, asked after a failure) would take the
// lost numbers for stored. So events go on a connection that buffers
// nothing while it connects again (a forward then fails and the node is
// answered 503), and the first event after it has connected again, of any
// agent, settles what was in flight on the old one: each such forward is
// answered 503 (its node sends it again, from the first it has not seen
// stored: JetStream's duplicate window drops what did land), and what the
// relay knew of its agent's numbering is read again from the stream. Until
// an event of such an agent is forwarded again, one that skips ahead is
// answered 503 too, not refused: its node is still going back.
//
// Not ruled out: a forward decided on the old connection and sent on the
// new one, which needs the whole of a reconnect (a pause of a second or
// more, with a single server to go back to) to happen between the two
// steps.

// settle answers the forwards of earlier connections, when fwd has
// connected again since the relay last looked, and returns the
// connection's generation; an unsure error while it is away.
func (r *Relay) settle() (uint64, error) {
	if !r.fwd.IsConnected() {
		return 0, unsure{errors.New("the relay's connection to the stream is away")}
	}
	gen := r.fwd.Stats().Reconnects
	r.mu.Lock()
	if gen <= r.gen {
		r.mu.Unlock()
		return gen, nil
	}
	r.gen = gen
	var replies []string
	for token, f := range r.inflight {
		if f.gen < gen {
			delete(r.inflight, token)
			delete(r.seqs, f.agent)
			r.doubted[f.agent] = true
			replies = append(replies, f.reply)
		}
	}
	r.mu.Unlock()
	if len(replies) > 0 {
		r.log.Warn("the relay's connection to the stream was lost with events on their way; their nodes send them again", "events", len(replies))
	}
	for _, reply := range replies {
		replyJSON(r.nc, reply, pubAckError(503, 0, "the relay's connection to the stream was lost with the event on its way: send it again"))
	}
	return gen, nil
}

// unforward forgets the forward under token, which failed to leave, and
// what the relay knew of agent id's numbering: the events forwarded before
// it may have been lost with the connection.
func (r *Relay) unforward(token, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, token)
	delete(r.seqs, id)
	r.doubted[id] = true
}

// forwardingConn returns a connection with nc's options that buffers
// nothing while it connects again: nc itself when it is one.
func forwardingConn(nc *nats.Conn) (*nats.Conn, func(), error) {
	if nc.Opts.ReconnectBufSize < 0 {
		return nc, func() {}, nil
	}
	opts := nc.Opts
	opts.ReconnectBufSize = -1
	opts.Name += " (events)"
	// Not nc's handlers: those of whoever watches nc are for nc alone.
	opts.DisconnectedErrCB, opts.DisconnectedCB, opts.ReconnectedCB, opts.ClosedCB, opts.AsyncErrorCB = nil, nil, nil, nil, nil
	opts.DiscoveredServersCB, opts.LameDuckModeHandler, opts.ConnectedCB = nil, nil, nil
	fwd, err := opts.Connect()
	if err != nil {
		return nil, nil, fmt.Errorf("the relay's connection for events: %w", err)
	}
	return fwd, fwd.Close, nil
}

// acked takes JetStream's acknowledgement of a forwarded event: it hands
// it on to the node, and on success counts the event stored.
func (r *Relay) acked(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	r.mu.Lock()
	f, ok := r.inflight[token]
	delete(r.inflight, token)
	if ok {
		s := r.seqs[f.agent]
		if s != nil {
			if s.flying[f.n]--; s.flying[f.n] <= 0 {
				delete(s.flying, f.n)
			}
			if storedAck(m) {
				s.store(f.n, f.ends)
			}
		}
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	r.nc.PublishMsg(&nats.Msg{Subject: f.reply, Header: m.Header, Data: m.Data})
}

// store counts n stored.
func (s *sequence) store(n uint64, ends bool) {
	switch {
	case n == s.stored+1:
		s.stored = n
		for s.ahead[s.stored+1] {
			delete(s.ahead, s.stored+1)
			s.stored++
		}
	case n > s.stored+1:
		s.ahead[n] = true
	}
	if ends {
		s.dead, s.death = true, n
	}
}

// reborn clears what the relay knows of an agent's death once rec, a
// record that does not say dead, names a new life: one numbered after
// the death. A record of the life that died, written before its death
// (the watch may pass it on after the relay stored the death), numbers
// below it: taken for a new life, it let the node store an event after
// the death.
func (r *Relay) reborn(id string, rec schemas.AgentRecord) {
	s := r.seqs[id]
	if s == nil || (s.death > 0 && rec.EventsBefore < s.death && rec.LastEvent < s.death) {
		return
	}
	s.dead, s.death = false, 0
}

// prune drops the acknowledgements the relay waited for too long.
func (r *Relay) prune(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for token, f := range r.inflight {
		if now.Sub(f.at) > ackWait {
			delete(r.inflight, token)
			if s := r.seqs[f.agent]; s != nil {
				if s.flying[f.n]--; s.flying[f.n] <= 0 {
					delete(s.flying, f.n)
				}
			}
		}
	}
}

// storedAck reports whether m is a JetStream acknowledgement of a stored
// message (a duplicate included), not an error or a no-responders status.
func storedAck(m *nats.Msg) bool {
	if len(m.Data) == 0 {
		return false
	}
	var ack struct {
		Stream string          `json:"stream"`
		Error  json.RawMessage `json:"error"`
	}
	return json.Unmarshal(m.Data, &ack) == nil && ack.Stream != "" && len(ack.Error) == 0
}

// duplicateAck is the acknowledgement of an event the stream holds
// already, as JetStream gives one for a duplicate.
func duplicateAck() []byte {
	b, _ := json.Marshal(struct {
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}{schemas.StreamName, 0, true})
	return b
}

// token names a forwarded event in the relay's reply subject.
func (r *Relay) token() string {
	return strconv.FormatUint(r.tokens.Add(1), 36)
}
