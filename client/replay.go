package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// From says where a replay starts. Its zero value is the beginning.
type From struct {
	// Event is an event number (1 is an agent's first); one agent only.
	Event uint64
	// Turn starts at the turn's start (the user's text that began it, when
	// it is there); one agent only.
	Turn int
	// Time starts at the first event stored at or after it.
	Time time.Time
	// New skips history: only events published from now on.
	New bool
}

// Replayed is one event as a replay delivers it: the envelope as stored,
// decoded only when asked, since many readers need only its kind.
type Replayed struct {
	Agent string
	N     uint64 // the agent's event number
	Seq   uint64 // the stream sequence
	Time  time.Time
	Node  string // the event's producer (HeaderNode)
	// RanOn is the node the event's turn ran on: Node, or, for the
	// coordinator's closing of a lost node's agent, that node.
	RanOn string
	Kind  schemas.Kind
	Turn  int
	Delta bool   // a streamed chunk, kept for liveness only
	Raw   []byte // the envelope as stored
	// Stray, when set, says why this message on the agent's subject is
	// not one of its events (it has no number, it is not an envelope, it
	// is a copy, its number does not follow): the replay skips it and
	// tells fn once, so a reader can say so and go on.
	Stray string
}

// Event decodes the envelope.
func (r Replayed) Event() (schemas.Event, error) { return schemas.Decode(r.Raw) }

// Gap says that an agent's events From through To are not in the stream:
// dropped by retention, or lost. A replay reports gaps; it never hides them.
type Gap struct {
	Agent    string `json:"agent_id"`
	From, To uint64
}

func (g Gap) Error() string {
	if g.From == g.To {
		return fmt.Sprintf("agent %s's event %d is missing from the stream", g.Agent, g.From)
	}
	return fmt.Sprintf("agent %s's events %d to %d are missing from the stream", g.Agent, g.From, g.To)
}

// errStop ends a replay from inside fn without an error.
var errStop = errors.New("stop")

// Replay delivers the events of the agents named (every agent when none)
// from a point, in stream order, to fn: each event, or a gap before it.
// With follow it goes on with events as they are published, on the same
// consumer, so there is no gap and no duplicate at the seam between
// history and live. It returns when ctx ends, fn returns an error, or,
// without follow, once it has caught up. Without follow, a replay of one
// agent the stream holds nothing of any more, though its record numbers
// events from the start point on (retention dropped them all), delivers
// nothing and returns those events as a Gap.
func (f *Direct) Replay(ctx context.Context, ids []string, from From, follow bool, fn func(Replayed, *Gap) error) error {
	if (from.Event > 0 || from.Turn > 0) && len(ids) != 1 {
		return schemas.Errf(schemas.CodeInvalid, "a replay from an event number or a turn names one agent")
	}
	subjects := []string{schemas.EventSubjects}
	if len(ids) > 0 {
		subjects = subjects[:0]
		for _, id := range ids {
			if err := schemas.ValidID(id); err != nil {
				return schemas.Errf(schemas.CodeInvalid, "agent %v", err)
			}
			subjects = append(subjects, schemas.EventSubject(id))
		}
	}
	stream, err := f.events(ctx)
	if err != nil {
		return err
	}
	aged, err := f.checkFrom(ctx, stream, ids, from)
	if err != nil {
		return err
	}
	if end := aged[firstOf(ids)]; end > 0 && !follow && !from.New && from.Time.IsZero() {
		// Nothing of the agent is stored, though its record numbers
		// events: retention dropped them all. Said, not taken for an
		// agent without events.
		if start := max(from.Event, 1); start <= end {
			return Gap{Agent: ids[0], From: start, To: end}
		}
		return nil
	}
	service.LongWait(ctx) // however many events there are to read
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: subjects}
	switch {
	case from.New:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	case from.Event > 0:
		seq, found, err := seekEvent(ctx, stream, ids[0], from.Event)
		if err != nil {
			return err
		}
		if !found && !follow {
			return nil // nothing at or after that event yet
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	case !from.Time.IsZero():
		t := from.Time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	// Without follow, the replay ends at the last event stored now.
	var end uint64
	if !follow {
		if from.New {
			return nil
		}
		last, err := lastOf(ctx, stream, subjects)
		if err != nil {
			return err
		}
		if last == nil || (!from.Time.IsZero() && last.Time.Before(from.Time)) || (cfg.OptStartSeq > last.Sequence) {
			return nil
		}
		end = last.Sequence
	}
	it, err := openReplay(ctx, stream, cfg, follow)
	if err != nil {
		return err
	}
	defer it.close()

	// A replay from the start (or from a turn, which reads from the start)
	// sees each agent's history from its first stored event; one from a
	// time or from now finds where each agent's events stand when it
	// first meets the agent.
	open := !from.New && from.Event == 0 && from.Time.IsZero()
	q := newSequencer(open, func(ctx context.Context, agent string, before uint64) (uint64, bool, error) {
		return lastEventBefore(ctx, f.nc, agent, before)
	})
	if from.Event > 0 {
		q.expect(ids[0], from.Event)
	}
	rs := &replayState{turn: from.Turn, started: from.Turn == 0, fn: fn}
	for {
		msg, err := it.next(ctx)
		if errors.Is(err, errReadAll) {
			// What it was to read up to has gone while it read.
			if err := rs.take(q.flush()); err != nil {
				return done(err)
			}
			if rs.passedOver() {
				return rs.missed()
			}
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		r, ok := replayed(msg)
		if it.stored != nil {
			it.stored.last = r.Seq // a consumer made again starts after it
		}
		if ok {
			ds, err := q.add(ctx, r)
			if err != nil {
				return err
			}
			if err := rs.take(ds); err != nil {
				return done(err)
			}
		}
		if !follow && r.Seq >= end {
			// The end of what is stored: what is held waits for nothing
			// more.
			if err := rs.take(q.flush()); err != nil {
				return done(err)
			}
		}
		if rs.passedOver() {
			// Only then does it matter whether the replay has caught up.
			caughtUp := !follow && r.Seq >= end
			if meta, err := msg.Metadata(); err == nil && follow {
				caughtUp = meta.NumPending == 0
			}
			if caughtUp {
				return rs.missed()
			}
		}
		if !follow && r.Seq >= end {
			return nil
		}
	}
}

// checkFrom refuses a replay of an agent the fabric does not know (no
// record and no stored event), and one that starts past an agent's end:
// an event number beyond the next one, a turn beyond the next one. An
// agent the stream holds nothing of ends where its record says (retention
// may have dropped every event of an idle one); those whose record
// numbers events are returned with their last event number.
func (f *Direct) checkFrom(ctx context.Context, stream jetstream.Stream, ids []string, from From) (map[string]uint64, error) {
	var aged map[string]uint64
	for _, id := range ids {
		tail, found, err := StreamTail(ctx, f.nc, stream, id)
		if err != nil {
			return nil, err
		}
		if !found {
			rec, written, err := f.recordWritten(ctx, id)
			switch {
			case schemas.CodeOf(err) == schemas.CodeNotFound:
				return nil, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", id)
			case err == nil && rec.LastEvent > 0:
				tail.Last, tail.Turn = rec.LastEvent, rec.Turn
				// A record just written may number events still on
				// their way to the stream (a close's above all, which
				// the record says before they are stored); one written
				// a while ago, with no close kept in it, has had them
				// stored, so what is not there was dropped.
				if rec.Closing == nil && time.Since(written) > agedSettle {
					if aged == nil {
						aged = map[string]uint64{}
					}
					aged[id] = rec.LastEvent
				}
			}
		}
		switch {
		case from.Event > tail.Last+1:
			return nil, schemas.Errf(schemas.CodeNotFound, "agent %s has %d events; event %d is past the end (the next one is %d)", id, tail.Last, from.Event, tail.Last+1)
		case from.Turn > tail.Turn+1:
			return nil, schemas.Errf(schemas.CodeNotFound, "agent %s has no turn %d yet (its last is turn %d)", id, from.Turn, tail.Turn)
		}
	}
	return aged, nil
}

// agedSettle is how long after an agent's record was last written a
// replay takes the events it numbers and the stream does not hold for
// dropped, not on their way.
const agedSettle = 5 * time.Second

// firstOf is ids' only id, "" unless there is exactly one.
func firstOf(ids []string) string {
	if len(ids) != 1 {
		return ""
	}
	return ids[0]
}

// replayIter is a replay's consumer.
type replayIter struct {
	it    jetstream.MessagesContext // one that follows
	close func()
	// stored, for a replay that only reads what is stored, is its
	// consumer; nil for one that follows.
	stored *storedReplay
}

// errReadAll says a replay that only reads what is stored has nothing
// left to read, though it has not reached the last event stored when it
// began: retention (or a person) dropped that event while it read.
var errReadAll = errors.New("the replay's consumer has nothing left to deliver")

// replayIdle is how long a replay that only reads what is stored waits
// for its next message before it asks whether any is left.
const replayIdle = time.Second

// next returns the replay's next message: for one that follows, whenever
// it comes; for one that only reads what is stored, see storedReplay.next.
func (r replayIter) next(ctx context.Context) (jetstream.Msg, error) {
	if r.stored == nil {
		return r.it.Next(jetstream.NextContext(ctx))
	}
	return r.stored.next(ctx)
}

// storedReplay is the consumer of a replay that only reads what is
// stored: an ephemeral consumer, deleted as soon as the read ends (a
// stream holds a bounded number of consumers and readers may be many),
// and made again from the message after the last it delivered when the
// server drops it (a reader paused past its inactive threshold, a server
// restart).
type storedReplay struct {
	stream jetstream.Stream
	cfg    jetstream.ConsumerConfig
	cons   jetstream.Consumer
	it     jetstream.MessagesContext
	stop   func() bool // stops it when the replay's context ends
	last   uint64      // the stream sequence of the last message read (set by Replay)
	tries  int         // consumers made since a message was last delivered
}

// open makes the consumer, from the message after the last delivered.
func (s *storedReplay) open(ctx context.Context) error {
	cfg := s.cfg
	if s.last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, s.last+1, nil
	}
	cons, err := s.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "replay: %v", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "replay: %v", err)
	}
	s.cons, s.it, s.stop = cons, it, context.AfterFunc(ctx, it.Stop)
	return nil
}

// close stops the consumer and deletes it.
func (s *storedReplay) close(ctx context.Context) {
	s.stop()
	s.it.Stop()
	del, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.stream.DeleteConsumer(del, s.cons.CachedInfo().Name)
}

// reopen makes the consumer again after the server dropped it, up to a
// few times without a message in between.
func (s *storedReplay) reopen(ctx context.Context, why error) error {
	if s.tries++; s.tries > 3 {
		return schemas.Errf(schemas.CodeUnavailable, "replay: the server dropped its consumer %d times: %v", s.tries, why)
	}
	s.stop()
	s.it.Stop()
	return s.open(ctx)
}

// dropped reports whether err says the server no longer has the
// consumer.
func dropped(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

// next returns the next message, or errReadAll once the consumer has
// nothing left: it asks after each replayIdle of waiting, since what it
// was to read up to may have gone while it read.
func (s *storedReplay) next(ctx context.Context) (jetstream.Msg, error) {
	wait := replayIdle
	for {
		// The replay's context ending stops the iterator (open).
		msg, err := s.it.Next(jetstream.NextMaxWait(wait))
		switch {
		case err == nil:
			s.tries = 0
			return msg, nil
		case ctx.Err() != nil:
			return nil, err
		case dropped(err):
			if err := s.reopen(ctx, err); err != nil {
				return nil, err
			}
			wait = replayIdle
			continue
		case !errors.Is(err, nats.ErrTimeout):
			return nil, err
		case wait < replayIdle:
			// Asked, nothing left, and nothing the server delivered
			// before it answered has come since.
			return nil, errReadAll
		}
		info, err := s.cons.Info(ctx)
		switch {
		case dropped(err):
			if err := s.reopen(ctx, err); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, schemas.Errf(schemas.CodeUnavailable, "replay: %v", err)
		case info.NumPending == 0:
			// A message the server delivered before it counted reaches
			// this connection before the count: a short wait takes it.
			wait = replayIdle / 10
		}
	}
}

// followIdle is how long the server keeps a following replay's consumer
// with no reader pulling from it.
const followIdle = 30 * time.Second

// openReplay starts the consumer of a replay. One that follows is an
// ordered consumer, which survives reconnects; one that only reads what is
// stored is a storedReplay.
func openReplay(ctx context.Context, stream jetstream.Stream, cfg jetstream.OrderedConsumerConfig, follow bool) (replayIter, error) {
	if follow {
		if cfg.InactiveThreshold == 0 {
			// A reader killed where it stood leaves its consumer on the
			// server, which counts it among the stream's thousand until it
			// has been idle this long: nats.go's default is five minutes.
			// A live reader's pulls keep it from idling.
			cfg.InactiveThreshold = followIdle
		}
		cons, err := stream.OrderedConsumer(ctx, cfg)
		if err != nil {
			return replayIter{}, schemas.Errf(schemas.CodeUnavailable, "replay: %v", err)
		}
		it, err := cons.Messages()
		if err != nil {
			return replayIter{}, err
		}
		stop := context.AfterFunc(ctx, it.Stop)
		return replayIter{it: it, close: func() {
			stop()
			it.Stop()
			// Stopping it leaves the consumer on the server; a reader
			// that goes removes it, so readers that come and go (a
			// dashboard's tabs, scripts that stop a follow) do not fill
			// the stream's room for consumers.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if name := cons.CachedInfo().Name; name != "" {
				stream.DeleteConsumer(ctx, name)
			}
		}}, nil
	}
	s := &storedReplay{stream: stream, cfg: jetstream.ConsumerConfig{
		FilterSubjects:    cfg.FilterSubjects,
		DeliverPolicy:     cfg.DeliverPolicy,
		OptStartSeq:       cfg.OptStartSeq,
		OptStartTime:      cfg.OptStartTime,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: 30 * time.Second,
	}}
	if err := s.open(ctx); err != nil {
		return replayIter{}, err
	}
	return replayIter{stored: s, close: func() { s.close(ctx) }}, nil
}

// replayState is what a replay remembers between events.
type replayState struct {
	turn    int        // the turn a replay from a turn starts at
	started bool       // that turn has begun (always, for other replays)
	pending []Replayed // the echoes of the turn asked for and later ones, held back until it begins
	first   uint64     // the number of the first event seen (a replay from a turn names one agent)
	whole   bool       // the life being read began in the stored history
	passed  *Replayed  // the start of a later turn, where the turn asked for was dropped
	fn      func(Replayed, *Gap) error
}

// take hands what the sequencer delivers to add, and strays straight to
// fn once the replay has reached what was asked for.
func (rs *replayState) take(ds []delivery) error {
	for _, d := range ds {
		if d.r.Stray != "" {
			if rs.started {
				if err := rs.fn(d.r, nil); err != nil {
					return err
				}
			}
			continue
		}
		if err := rs.add(&d.r, d.gap); err != nil {
			return err
		}
	}
	return nil
}

// add delivers r, or holds it back while a replay from a turn has not
// reached that turn yet. A turn that begins past the one asked for, in a
// life whose beginning the stream no longer has, means the turn asked
// for was dropped by retention; a later life of the id may still have
// it, so the replay reads on, and says so (missed) once it has caught up
// without finding it, rather than skipping ahead in silence.
func (rs *replayState) add(r *Replayed, gap *Gap) error {
	if rs.first == 0 {
		rs.first, rs.whole = r.N, r.N == 1
	}
	if !rs.started {
		switch {
		case r.Turn == 0 && isIdle(*r):
			rs.whole = true // a new life of the id, from its beginning
			return nil
		case r.Kind == schemas.KindUserText:
			// An echo is stamped with the turn before its own; turns sent
			// while another ran have theirs before the turn asked for
			// begins.
			if r.Turn >= rs.turn-1 {
				rs.pending = append(rs.pending, *r)
			} else {
				rs.pending = nil
			}
			return nil
		case r.Turn >= rs.turn && (r.Kind == schemas.KindTurnStarted || isWorking(*r)):
			if r.Turn > rs.turn && !rs.whole {
				if rs.passed == nil {
					rs.passed = r
				}
				return nil
			}
			rs.started = true
			for _, p := range rs.pending {
				if err := rs.fn(p, nil); err != nil {
					return err
				}
			}
			rs.pending = nil
		case r.Turn >= rs.turn && !rs.whole && withinTurn(r.Kind):
			// What only a begun turn makes, of the turn asked for or a
			// later one, before its start: retention dropped the turn's
			// beginning. (An error or a status may come between turns.)
			if rs.passed == nil {
				rs.passed = r
			}
			return nil
		default:
			return nil
		}
	}
	return rs.fn(*r, gap)
}

// withinTurn reports whether an event of kind is made only inside a
// begun turn: the model's output and the tools it runs.
func withinTurn(kind schemas.Kind) bool {
	switch kind {
	case schemas.KindAssistantText, schemas.KindThought, schemas.KindToolUse, schemas.KindToolResult,
		schemas.KindToolInputDelta, schemas.KindPlan, schemas.KindPermission, schemas.KindResult:
		return true
	}
	return false
}

// passedOver reports whether a replay from a turn has passed where the
// turn would be without finding it.
func (rs *replayState) passedOver() bool { return !rs.started && rs.passed != nil }

// missed is the error of a replay from a turn that has caught up with
// the stream without finding the turn, which retention dropped.
func (rs *replayState) missed() error {
	if p := rs.passed; p.Kind != schemas.KindTurnStarted && !isWorking(*p) {
		return schemas.Errf(schemas.CodeNotFound, "turn %d of agent %s is past the stream's retention; its stored history now starts at event %d, part way through turn %d (read from event %d for what is left of it)",
			rs.turn, p.Agent, rs.first, p.Turn, rs.first)
	}
	return schemas.Errf(schemas.CodeNotFound, "turn %d of agent %s is past the stream's retention; its stored history now starts at event %d, and turn %d is the first it holds whole",
		rs.turn, rs.passed.Agent, rs.first, rs.passed.Turn)
}

// lastOf is the last stored message on any of the subjects, or nil.
func lastOf(ctx context.Context, stream jetstream.Stream, subjects []string) (*jetstream.RawStreamMsg, error) {
	var last *jetstream.RawStreamMsg
	for _, subj := range subjects {
		m, err := stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, schemas.Errf(schemas.CodeUnavailable, "read the stream: %v", err)
		}
		if last == nil || m.Sequence > last.Sequence {
			last = m
		}
	}
	return last, nil
}

func done(err error) error {
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

func isWorking(r Replayed) bool { return hasStatus(r, schemas.StatusWorking) }

func isIdle(r Replayed) bool { return hasStatus(r, schemas.StatusIdle) }

func hasStatus(r Replayed, status schemas.AgentStatus) bool {
	if r.Kind != schemas.KindStatus {
		return false
	}
	ev, err := r.Event()
	st, ok := ev.Payload.(schemas.Status)
	return err == nil && ok && st.Status == status
}

// replayed reads what a replay needs of a message; its Seq is set even
// when the message is on no agent's subject, which it reports as not ok.
// A message on an agent's subject that is not one of its events by its
// form comes back with Stray set.
func replayed(msg jetstream.Msg) (Replayed, bool) {
	var r Replayed
	if meta, err := msg.Metadata(); err == nil {
		r.Seq, r.Time = meta.Sequence.Stream, meta.Timestamp
	}
	id, ok := schemas.AgentFromSubject(msg.Subject())
	if !ok {
		return r, false
	}
	h := msg.Headers()
	r.Agent, r.Node = id, h.Get(schemas.HeaderNode)
	r.RanOn = schemas.RanOn(r.Node, h.Get(schemas.HeaderClosedFor))
	r.Raw = append([]byte(nil), msg.Data()...)
	agent, n, err := schemas.ParseMsgID(h.Get(schemas.HeaderMsgID))
	if err != nil || agent != id {
		r.Stray = strayNoNumber
		return r, true
	}
	r.N = n
	if r.Kind, r.Turn, r.Delta, err = schemas.Peek(msg.Data()); err != nil {
		r.Stray = strayNotEnvelope
	}
	return r, true
}

// seekEvent finds the stream sequence of an agent's event n, by binary
// search over the stream with next-by-subject reads. When the agent has no
// event n or later yet, found is false and seq is the stream's next
// sequence as it was before the search began, so a reader that starts
// there misses no event stored since (starting at "new" could). An event
// older than the stream keeps is an error that says where the agent's
// history now starts.
func seekEvent(ctx context.Context, stream jetstream.Stream, id string, n uint64) (seq uint64, found bool, err error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, false, schemas.Errf(schemas.CodeUnavailable, "read stream %s: %v", schemas.StreamName, err)
	}
	subject := schemas.EventSubject(id)
	nextFrom := func(seq uint64) (*jetstream.RawStreamMsg, uint64, error) {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, 0, nil
		}
		if err != nil {
			return nil, 0, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: %v", id, err)
		}
		// A stray has no number of the agent's: the search reads on past it.
		for range walkLimit {
			sm := storedMsg{seq: m.Sequence, hdr: m.Header, data: m.Data}
			if num := sm.number(id); num > 0 {
				return m, num, nil
			}
			if m, err = stream.GetMsg(ctx, m.Sequence+1, jetstream.WithGetMsgSubject(subject)); errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil, 0, nil
			} else if err != nil {
				return nil, 0, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: %v", id, err)
			}
		}
		return nil, 0, schemas.Errf(schemas.CodeUnavailable, "agent %s's stream holds more than %d messages in a row that are not its events", id, walkLimit)
	}
	first, firstN, err := nextFrom(info.State.FirstSeq)
	if err != nil {
		return 0, false, err
	}
	if first == nil {
		return info.State.LastSeq + 1, false, nil // none yet, or none kept
	}
	if n < firstN {
		return 0, false, schemas.Errf(schemas.CodeNotFound, "agent %s's events before %d are past the stream's retention; its history now starts at event %d", id, firstN, firstN)
	}
	lo, hi := first.Sequence, info.State.LastSeq+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, num, err := nextFrom(mid)
		if err != nil {
			return 0, false, err
		}
		if m == nil || num >= n {
			hi = mid
		} else {
			lo = m.Sequence + 1
		}
	}
	m, _, err := nextFrom(lo)
	switch {
	case err != nil:
		return 0, false, err
	case m == nil:
		return info.State.LastSeq + 1, false, nil
	}
	return m.Sequence, true, nil
}
