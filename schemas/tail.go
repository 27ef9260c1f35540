package schemas

import (
	"encoding/json"
	"fmt"
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
	// Errored says the last event is an error, which comes inside a turn
	// or between turns (an unreadable line, the outbox's notice): whether
	// a turn is open is then the agent record's to say.
	Errored bool `json:"errored,omitempty"`
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
	case Result, UserText:
		t.Open = false
	case Status:
		t.Open = p.Status == StatusWorking
		t.Ended = p.Status == StatusDead || p.Status == StatusClosed
	case Error:
		t.Errored = true
	}
	return t, nil
}

// Orphaned returns the events that close the stream of an agent whose
// process is gone: an error saying why (what happened, such as "node mac
// was lost"), a cancelled result when a turn was open, and status dead.
// turn is the agent's current turn, used when the stream leaves none
// open, and working what its record says, used when the stream cannot
// tell. Nothing is returned for a stream that is closed already.
func (t Tail) Orphaned(turn int, working bool, what string) []Event {
	if t.Ended {
		return nil
	}
	open := t.Open
	if t.Errored {
		open = working
	}
	var evs []Event
	if open {
		turn = t.Turn
		evs = append(evs,
			Event{Turn: turn, Payload: Errorf("%s during turn %d; the turn cannot finish", what, turn)},
			Event{Turn: turn, Payload: Result{StopReason: StopCancelled}})
	} else {
		evs = append(evs, Event{Turn: turn, Payload: Errorf("%s; the agent is gone with it", what)})
	}
	return append(evs, Event{Turn: turn, Payload: Status{Status: StatusDead}})
}

// LostRangeError is the event a node publishes, numbered to, after a range
// of an agent's event numbers it may have used but cannot publish (its
// journal was lost): the numbers from through to-1 are named in its data,
// so every reader can tell the gap for what it is.
func LostRangeError(agent string, turn int, from, to uint64) Event {
	return Event{Turn: turn, Payload: ErrorWith(
		fmt.Sprintf("events %d to %d of agent %s may have been lost: the node's journal was lost before they were stored; their numbers are not used again", from, to, agent),
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
