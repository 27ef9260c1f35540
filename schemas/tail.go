package schemas

import (
	"encoding/json"
	"fmt"
	"time"
)

// Tail is how an agent's stream ends: the number of its last stored
// event, and what that event leaves behind. Whoever closes the stream of
// an agent whose process is gone (the coordinator for a lost node, a
// restarted node for its previous life) reads it first.
type Tail struct {
	// Last is the last stored event number, 0 when none is stored.
	Last uint64 `json:"last"`
	// Turn is the turn of the last event.
	Turn int `json:"turn,omitempty"`
	// Open says the last event leaves a turn open: anything but a result,
	// a status other than working, or a user's echo (sent just before a
	// turn starts).
	Open bool `json:"open,omitempty"`
	// Ended says the last event is a dead or closed status: the stream is
	// closed already.
	Ended bool `json:"ended,omitempty"`
	// Dead says the last event is a dead status: the life it ended has
	// nothing more to store.
	Dead bool `json:"dead,omitempty"`
	// Errored says the last event is an error, which comes inside a turn
	// or between turns (an unreadable line, the outbox's notice): whether
	// a turn is open is then the agent record's to say.
	Errored bool `json:"errored,omitempty"`
	// Echo says the last event is a user's echo: turn Turn+1 was numbered
	// (an echo is stamped with the turn before its own).
	Echo bool `json:"echo,omitempty"`
	// Result says the last event is the result that ended turn Turn.
	Result bool `json:"result,omitempty"`
	// Journaled says the closer holds what the life numbered that the
	// stream lacks and sends it (a restarted node, its journal): the close
	// numbers after the record's last event whatever the stream holds.
	// Never stored with a close.
	Journaled bool `json:"-"`
	// Oldest, when the stream holds none of the agent's events, is when
	// the stream's oldest message was stored (unix seconds): retention
	// drops the oldest first, so it has dropped nothing stored after
	// that. 0 when unknown.
	Oldest float64 `json:"oldest,omitempty"`
	// Whole, when the stream holds none of the agent's events, says the
	// stream still holds its first message: retention has dropped none.
	Whole bool `json:"whole,omitempty"`
}

// TailOf is the tail of a stream whose last message carries msgID (its
// Nats-Msg-Id) and env (an encoded envelope). An envelope that does not
// decode leaves nothing open that could be closed; its number is what
// counts.
func TailOf(msgID string, env []byte) (Tail, error) {
	_, n, err := ParseMsgID(msgID)
	if err != nil {
		return Tail{}, err
	}
	ev, err := Decode(env)
	if err != nil {
		return Tail{Last: n}, nil
	}
	t := Tail{Last: n, Turn: ev.Turn, Open: true}
	switch p := ev.Payload.(type) {
	case Result:
		t.Open, t.Result = false, true
	case UserText:
		t.Open, t.Echo = false, true
	case Status:
		t.Open = p.Status == StatusWorking
		t.Ended = p.Status == StatusDead || p.Status == StatusClosed
		t.Dead = p.Status == StatusDead
	case Error:
		t.Errored = true
	}
	return t, nil
}

// ClosingFrom is where the events closing rec's life are numbered from
// (they take the numbers after it), and the tail Closing reads, given t,
// the stream's tail: after the stream's end or the id's earlier lives
// (EventsBefore). When the stream ends in an earlier life of the id, none
// of this life is stored and retention dropped none of it (it drops the
// oldest first, and kept an older event): what the record numbered was
// never stored (its node died holding it), and the close numbers on from
// the earlier lives, reading a tail that leaves nothing of this life
// open or ended (the earlier life's close is not this one's). So too when
// the stream holds none of the id's events but its first message still,
// or its oldest is older than the life (by retentionMargin): the stream
// has no gap where those events would have been. When the stream holds
// none of this life and retention may have dropped its events, or the
// closer holds what the life numbered and sends it (Journaled), the close
// numbers after the last number its record says was handed out
// (LastEvent), and the turns it says began and ended (all begun but the
// running one) are taken as ended, not begun and cancelled again: a
// number stored is never handed out again.
func (t Tail) ClosingFrom(rec AgentRecord) (Tail, uint64) {
	n := max(t.Last, rec.EventsBefore)
	if t.Last > rec.EventsBefore {
		return t, n
	}
	journaled := t.Journaled
	switch {
	case t.Last > 0:
		// The stream ends in an earlier life of the id: that life's end
		// is not this one's.
		t = Tail{Last: n, Turn: max(t.Turn, rec.TurnsBefore), Journaled: journaled}
		if !journaled {
			return t, n
		}
	case !journaled && (t.Whole || (t.Oldest > 0 && rec.CreatedAt > 0 && t.Oldest+retentionMargin.Seconds() <= rec.CreatedAt)):
		return t, n
	}
	n = max(n, rec.LastEvent)
	if rec.LastEvent > rec.EventsBefore {
		ended := rec.Turn - rec.Held
		if rec.Status == StatusWorking {
			ended-- // the running one is closed, its start with it
		}
		t.Turn = max(t.Turn, ended)
	}
	return t, n
}

// retentionMargin is how much older than a life the stream's oldest
// message must be for retention to have dropped none of the life's
// events: the life's start is its node's clock, the message's the
// server's.
const retentionMargin = time.Minute

// Closing returns the events that close the stream of an agent whose
// process is gone, from the stream's tail and the agent's last record
// (whose Turn and Held the node writes before a turn's number is given
// out, and before a held turn begins). what says what happened ("node mac
// was lost"). The turn that had begun, when it is open, gets an error
// saying so and a cancelled result (and its start, when that was never
// stored), carrying what the record says the turn used so far (Running); each turn numbered that never began gets its start, an error
// and a cancelled result, in its place; then status dead. Nothing is
// returned for a stream that is closed already.
func (t Tail) Closing(rec AgentRecord, what string) []Event {
	if t.Ended {
		return nil
	}
	first, begun, numbered := t.closingTurns(rec)
	working := rec.Status == StatusWorking
	var evs []Event
	closeTurn := func(k int, start bool, msg string) {
		if start {
			evs = append(evs, Event{Turn: k, Payload: TurnStarted{}})
		}
		r := Result{StopReason: StopCancelled}
		if working && k == rec.Turn-rec.Held && rec.Running != nil {
			u := *rec.Running // what the running turn used, as last recorded
			r.Usage = &u
		}
		evs = append(evs, Event{Turn: k, Payload: Errorf("%s", msg)}, Event{Turn: k, Payload: r})
	}
	for k := first; k <= numbered; k++ {
		during := fmt.Sprintf("%s during turn %d; the turn cannot finish", what, k)
		switch {
		case k > begun:
			closeTurn(k, true, fmt.Sprintf("%s before turn %d began; it will not run", what, k))
		case k > t.Turn:
			// Begun, says the record, but nothing stamped with it is
			// stored, its start included.
			closeTurn(k, true, during)
		case !t.Echo: // k is the tail's turn
			if (t.Open && !t.Errored) || (t.Errored && (working || k < begun)) {
				closeTurn(k, false, during)
			}
		case k == begun && working:
			// The last stored is the echo of a later turn; the record says
			// this one runs.
			closeTurn(k, false, during)
		}
	}
	if len(evs) == 0 {
		evs = append(evs, Event{Turn: numbered, Payload: Errorf("%s; the agent is gone with it", what)})
	}
	return append(evs, Event{Turn: numbered, Payload: Status{Status: StatusDead}})
}

// closingTurns are the turns Closing goes over, first to numbered, and
// the last that began.
func (t Tail) closingTurns(rec AgentRecord) (first, begun, numbered int) {
	numbered = max(rec.Turn, t.Turn)
	if t.Echo {
		numbered = max(numbered, t.Turn+1)
	}
	begun = max(min(rec.Turn-rec.Held, numbered), 0)
	if !t.Echo {
		begun = max(begun, t.Turn) // what is stored of a turn says it began
	}
	return max(min(t.Turn, begun), 1), begun, numbered
}

// LostRangeError is the event a node publishes, numbered to, after a range
// of an agent's event numbers it may have used but cannot publish (its
// journal was lost): the numbers from through to-1 are named in its data,
// so every reader can tell the gap for what it is.
func LostRangeError(agent string, turn int, from, to uint64) Event {
	return Event{Turn: turn, Payload: ErrorWith(
		fmt.Sprintf("events %d to %d of agent %s may have been lost: the node's journal did not keep them (it was lost, or its disk was full) and they were not stored; their numbers are not used again", from, to, agent),
		lostRange{From: from, To: to})}
}

type lostRange struct {
	From uint64 `json:"lost_from"`
	To   uint64 `json:"lost_to"`
}

// LostRange reads the range a lost-range error names; ok is false for
// any other envelope.
func LostRange(env []byte) (from, to uint64, ok bool) {
	ev, err := Decode(env)
	if err != nil {
		return 0, 0, false
	}
	e, isErr := ev.Payload.(Error)
	if !isErr || len(e.Data) == 0 {
		return 0, 0, false
	}
	var r lostRange
	if json.Unmarshal(e.Data, &r) != nil || r.From == 0 || r.To < r.From {
		return 0, 0, false
	}
	return r.From, r.To, true
}
