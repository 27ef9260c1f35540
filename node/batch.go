package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/shoalfabric/shoal/schemas"
)

// A sender puts the publisher's events to the stream, one at a time and
// in order, and tells of each when the stream has stored it (or not).
type sender interface {
	// send publishes msg; alone says it is sent by itself (the publisher
	// probes the stream with one event after a failure) and is to be
	// acknowledged at once.
	send(msg *nats.Msg, alone bool) (future, error)
	// idle says nothing more is ready to send: what was sent learns its
	// fate soon, not only once more is sent.
	idle()
	// restart begins afresh after a failure: the next send starts anew.
	restart()
	// close stops the sender; what is unresolved fails.
	close()
}

// A future is one event sent: wait returns once the stream has stored it
// (nil) or it failed.
type future interface {
	wait() error
	Msg() *nats.Msg
}

// asyncSender is JetStream's asynchronous publish: the stream answers
// each event with an acknowledgement of its own.
type asyncSender struct{ js jetstream.JetStream }

func (s asyncSender) send(msg *nats.Msg, _ bool) (future, error) {
	f, err := s.js.PublishMsgAsync(msg)
	if err != nil {
		return nil, err
	}
	return asyncFuture{f}, nil
}

// asyncFuture is an asynchronous publish's acknowledgement.
type asyncFuture struct{ jetstream.PubAckFuture }

func (f asyncFuture) wait() error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	}
}
func (asyncSender) idle()    {}
func (asyncSender) restart() {}
func (asyncSender) close()   {}

// batchSender is JetStream's fast batch publishing (nats-server 2.14 and
// later, a stream with allow_batched): events go out one after another
// as they come, each stored as it arrives (a batch is not atomic), and
// the stream acknowledges them together, every so many events stored,
// instead of one reply per event. The reply subject of each event says
// its batch, its place in it and what it does (start, append, commit):
//
//	<inbox>.<batch>.<flow>.fail.<n>.<op>.$FI
//
// Gap mode "fail": the server ends a batch at the first event missing or
// refused, with an acknowledgement of what it stored, and the publisher
// sends the rest again in a new batch (go-back-N, as after a failed
// asynchronous publish). Every event keeps its Nats-Msg-Id, which the
// stream deduplicates in batches as in single publishes, so what is sent
// again is never stored twice. A batch is committed once nothing more is
// ready to send (after commitAfter), which brings the acknowledgement of
// its last events; the next event starts a new one.
//
// Nothing is ever stored after an event that is not: a new batch begins
// only once every event of the one before is acknowledged (so an event
// lost with its batch's end cannot be followed by a later one stored in
// another), and after any failure the sender sends nothing more until the
// publisher has begun again (restart) from the first event not stored.
type batchSender struct {
	nc      *nats.Conn
	publish func(*nats.Msg) error // nc.PublishMsg
	sub     *nats.Subscription
	prefix  string
	flow    int
	wait    time.Duration // how long an event may wait for its acknowledgement

	mu      sync.Mutex
	id      string // the open batch; "" when none
	head    string // its events' reply subject up to their number
	n       uint64 // the last event numbered in it
	waiting []*batchFuture
	// progress is when the stream last acknowledged an event waiting, or
	// when one began to wait with none before it.
	progress time.Time
	settled  *sync.Cond // waiting emptied, or the sender broke
	resolved *sync.Cond // some of waiting learnt their fate
	broken   error      // why nothing more is sent until restart
	commit   *time.Timer
	armed    bool // commit runs after commitAfter
	closed   bool
	done     chan struct{}
}

// commitAfter is how long a batch stays open once nothing more is ready
// to send: events that come meanwhile join it.
const commitAfter = 2 * time.Millisecond

// batchFlow is the most events the stream stores before it acknowledges
// them; the publisher's window must be larger.
const batchFlow = 256

func newBatchSender(nc *nats.Conn, window int, wait time.Duration) (*batchSender, error) {
	flow := max(1, min(batchFlow, window/2))
	// Every reader of agent.* sees the reply subject: no inbox, which
	// the fabric service would answer for anyone who names it.
	s := &batchSender{nc: nc, publish: nc.PublishMsg, prefix: schemas.BatchAckPrefix + "." + nuid.Next(), flow: flow, wait: wait, done: make(chan struct{})}
	s.settled = sync.NewCond(&s.mu)
	s.resolved = sync.NewCond(&s.mu)
	sub, err := nc.Subscribe(s.prefix+".>", s.reply)
	if err != nil {
		return nil, fmt.Errorf("the batch acknowledgements' inbox: %w", err)
	}
	sub.SetPendingLimits(-1, -1)
	s.sub = sub
	s.commit = time.AfterFunc(time.Hour, s.commitNow)
	s.commit.Stop()
	go s.watch()
	return s, nil
}

// batchFuture is one event's outcome: done is set once it is known, err
// says it failed. The stream acknowledges events many at a time, so the
// publisher mostly finds an event's fate known when it asks; a channel of
// its own for each event, made and closed, would cost more than the
// event's wait.
type batchFuture struct {
	s     *batchSender
	msg   *nats.Msg
	batch string
	n     uint64
	done  atomic.Bool
	err   error // set before done
}

// wait returns once the event's fate is known.
func (f *batchFuture) wait() error {
	if f.done.Load() {
		return f.err
	}
	s := f.s
	s.mu.Lock()
	for !f.done.Load() {
		s.resolved.Wait()
	}
	s.mu.Unlock()
	return f.err
}

func (f *batchFuture) Msg() *nats.Msg { return f.msg }

// resolve tells the event's fate; s.mu is held, and whoever resolves
// broadcasts s.resolved once done.
func (f *batchFuture) resolve(err error) {
	f.err = err
	f.done.Store(true)
}

// Operations of a fast batch, as its reply subjects name them.
const (
	batchStart     = 0
	batchAppend    = 1
	batchCommit    = 2
	batchCommitEOB = 3
)

// replySubject is the reply subject of the open batch's event s.n, which
// does op.
func (s *batchSender) replySubject(op int) string {
	if s.head == "" {
		s.head = s.prefix + "." + s.id + "." + strconv.Itoa(s.flow) + ".fail."
	}
	b := make([]byte, 0, len(s.head)+32)
	b = append(b, s.head...)
	b = strconv.AppendUint(b, s.n, 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(op), 10)
	b = append(b, ".$FI"...)
	return string(b)
}

func (s *batchSender) send(msg *nats.Msg, alone bool) (future, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commit.Stop()
	s.armed = false
	// A new batch waits for the one before to be acknowledged in full.
	for s.id == "" && len(s.waiting) > 0 && s.broken == nil && !s.closed {
		s.settled.Wait()
	}
	switch {
	case s.closed:
		return nil, nats.ErrConnectionClosed
	case s.broken != nil:
		return nil, fmt.Errorf("not sent after an event the stream did not store: %w", s.broken)
	}
	op := batchAppend
	if s.id == "" {
		s.id, s.n, s.head, op = nuid.Next(), 0, "", batchStart
		if alone {
			op = batchCommit // a batch of one, acknowledged once stored
		}
	}
	s.n++
	f := &batchFuture{s: s, msg: msg, batch: s.id, n: s.n}
	msg.Reply = s.replySubject(op)
	if err := s.publish(msg); err != nil {
		s.n--
		s.breakLocked(err)
		return nil, err
	}
	if len(s.waiting) == 0 {
		s.progress = time.Now() // the wait for an acknowledgement begins
	}
	s.waiting = append(s.waiting, f)
	if op == batchCommit {
		s.id = ""
	} else if alone {
		s.commitLocked()
	}
	return f, nil
}

func (s *batchSender) idle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id != "" && !s.armed {
		s.armed = true
		s.commit.Reset(commitAfter)
	}
}

// commitNow commits the open batch with a commit that stores nothing.
func (s *batchSender) commitNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
	s.commitLocked()
}

func (s *batchSender) commitLocked() {
	if s.id == "" || s.broken != nil || s.closed {
		return
	}
	s.n++
	m := &nats.Msg{Subject: schemas.BatchEndSubject, Reply: s.replySubject(batchCommitEOB)}
	s.id = ""
	// A commit lost on the way leaves its events to the timeout, which
	// fails them; nothing is sent after them meanwhile.
	s.publish(m)
}

func (s *batchSender) restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commit.Stop()
	s.armed = false
	s.id = ""
	s.failLocked(errors.New("the publisher began again"))
	s.broken = nil
}

func (s *batchSender) close() {
	s.commit.Stop()
	s.sub.Unsubscribe()
	close(s.done)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.failLocked(nats.ErrConnectionClosed)
	s.settled.Broadcast()
}

// breakLocked stops the sender at a failure: every event waiting fails,
// the open batch is given up, and nothing is sent until restart.
func (s *batchSender) breakLocked(err error) {
	if s.broken == nil {
		s.broken = err
	}
	s.id = ""
	s.failLocked(err)
	s.settled.Broadcast()
}

// batchReply is any of the stream's answers to a batch: a flow
// acknowledgement, a gap, an error ("type"), or the batch's end (an
// acknowledgement with the stream, or an error).
type batchReply struct {
	Type   string              `json:"type"`
	Seq    uint64              `json:"seq"`
	Stream string              `json:"stream"`
	Batch  string              `json:"batch"`
	Count  uint64              `json:"count"`
	Error  *jetstream.APIError `json:"error"`
}

// reply takes an answer: events of its batch up to the number it names
// are stored; a batch that ended leaves the rest of its events failed,
// and with them every later one.
func (s *batchSender) reply(m *nats.Msg) {
	id := batchOf(m.Subject, len(s.prefix))
	var r batchReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Type == "ack":
		s.ackLocked(id, r.Seq)
	case r.Type == "gap" || r.Type == "err":
		// The batch ends here; its acknowledgement says what it stored.
		s.breakLocked(fmt.Errorf("the stream ended the batch: %s", m.Data))
	case r.Error != nil:
		s.breakLocked(r.Error)
	case r.Stream != "":
		// The batch's end: what it stored, and nothing after.
		s.ackLocked(id, r.Count)
		for _, f := range s.waiting {
			if f.batch == id {
				s.breakLocked(errors.New("the stream did not store it in its batch"))
				break
			}
		}
	}
}

// ackLocked acknowledges batch id's waiting events up to n.
func (s *batchSender) ackLocked(id string, n uint64) {
	kept := s.waiting[:0]
	for _, f := range s.waiting {
		if f.batch == id && f.n <= n {
			f.resolve(nil)
		} else {
			kept = append(kept, f)
		}
	}
	if len(kept) < len(s.waiting) {
		s.progress = time.Now()
		s.resolved.Broadcast()
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
	if len(s.waiting) == 0 {
		s.settled.Broadcast()
	}
}

// failLocked fails every waiting event.
func (s *batchSender) failLocked(err error) {
	for _, f := range s.waiting {
		f.resolve(err)
	}
	if len(s.waiting) > 0 {
		s.resolved.Broadcast()
	}
	clear(s.waiting)
	s.waiting = s.waiting[:0]
}

// watch fails what waits when the stream has acknowledged nothing for
// the sender's wait (the stream or its leader went away), as an
// asynchronous publish times out.
func (s *batchSender) watch() {
	t := time.NewTicker(s.wait / 4)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			s.mu.Lock()
			if len(s.waiting) > 0 && now.Sub(s.progress) > s.wait {
				s.breakLocked(fmt.Errorf("%w: no acknowledgement of the batch in %s", nats.ErrTimeout, s.wait))
			}
			s.mu.Unlock()
		}
	}
}

// batchOf is the batch a reply subject names, after the inbox prefix.
func batchOf(subject string, prefix int) string {
	if len(subject) <= prefix+1 {
		return ""
	}
	rest := subject[prefix+1:]
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		return rest[:i]
	}
	return rest
}

// allowsBatches reports whether the stream takes fast batches.
func allowsBatches(info *jetstream.StreamInfo) bool {
	return info != nil && info.Config.AllowBatchPublish
}
