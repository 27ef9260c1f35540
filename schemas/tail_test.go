package schemas

import (
	"fmt"
	"strings"
	"testing"
)

func TestTailClosing(t *testing.T) {
	enc := func(ev Event) []byte {
		b, err := Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	working := func(turn, held int) AgentRecord {
		return AgentRecord{Status: StatusWorking, Turn: turn, Held: held}
	}
	idle := func(turn int) AgentRecord { return AgentRecord{Status: StatusIdle, Turn: turn} }
	text := Event{Turn: 3, Payload: AssistantText{Delta: true, Content: Text("x")}}
	cases := []struct {
		name string
		last Event
		rec  AgentRecord
		want string // the closing events, kind@turn, the error's kind of message in brackets
	}{
		{"mid-turn", text, working(3, 0), "error[during]@3 result@3 status@3"},
		{"mid-turn, two held", text, working(5, 2), "error[during]@3 result@3 turn_started@4 error[before]@4 result@4 turn_started@5 error[before]@5 result@5 status@5"},
		{"working", Event{Turn: 3, Payload: Status{Status: StatusWorking}}, working(3, 0), "error[during]@3 result@3 status@3"},
		{"after a result", Event{Turn: 3, Payload: Result{StopReason: StopEndTurn}}, idle(3), "error[gone]@3 status@3"},
		{"after a result, the next begun unstored", Event{Turn: 3, Payload: Result{StopReason: StopEndTurn}}, working(4, 0), "turn_started@4 error[during]@4 result@4 status@4"},
		{"idle", Event{Turn: 3, Payload: Status{Status: StatusIdle}}, idle(3), "error[gone]@3 status@3"},
		{"the echo of the next, which began", Event{Turn: 3, Payload: UserText{Content: Text("q")}}, working(4, 0), "turn_started@4 error[during]@4 result@4 status@4"},
		{"the echo of a held one", Event{Turn: 4, Payload: UserText{Content: Text("q")}}, working(5, 2), "error[during]@3 result@3 turn_started@4 error[before]@4 result@4 turn_started@5 error[before]@5 result@5 status@5"},
		{"an echo beyond the record", Event{Turn: 3, Payload: UserText{Content: Text("q")}}, idle(3), "turn_started@4 error[before]@4 result@4 status@4"},
		{"dead", Event{Turn: 3, Payload: Status{Status: StatusDead}}, working(5, 2), ""},
		{"closed", Event{Turn: 3, Payload: Status{Status: StatusClosed}}, idle(3), ""},
		{"an error between turns", Event{Turn: 3, Payload: Errorf("unreadable")}, idle(3), "error[gone]@3 status@3"},
		{"an error in a turn", Event{Turn: 3, Payload: Errorf("unreadable")}, working(3, 0), "error[during]@3 result@3 status@3"},
	}
	for _, c := range cases {
		tail, err := TailOf(MsgID("a", 42), enc(c.last))
		if err != nil || tail.Last != 42 {
			t.Fatalf("%s: %+v %v", c.name, tail, err)
		}
		var got []string
		for _, ev := range tail.Closing(c.rec, "node x was lost") {
			s := string(ev.Kind())
			if e, ok := ev.Payload.(Error); ok {
				switch {
				case strings.HasPrefix(e.Message, fmt.Sprintf("node x was lost during turn %d;", ev.Turn)):
					s += "[during]"
				case strings.HasPrefix(e.Message, fmt.Sprintf("node x was lost before turn %d began;", ev.Turn)):
					s += "[before]"
				case e.Message == "node x was lost; the agent is gone with it":
					s += "[gone]"
				default:
					s += "[" + e.Message + "]"
				}
			}
			if r, ok := ev.Payload.(Result); ok && r.StopReason != StopCancelled {
				s += "[" + string(r.StopReason) + "]"
			}
			if st, ok := ev.Payload.(Status); ok && st.Status != StatusDead {
				s += "[" + string(st.Status) + "]"
			}
			got = append(got, fmt.Sprintf("%s@%d", s, ev.Turn))
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, g, c.want)
		}
		// The close a record keeps makes the same events again.
		rec := c.rec
		rec.ID, rec.LastEvent = "a", 40
		dead := CloseLost(rec, tail, "node x was lost", CloserName)
		_, again, err := dead.ClosingEvents()
		if err != nil || fmt.Sprint(again) != fmt.Sprint(tail.Closing(c.rec, "node x was lost")) {
			t.Errorf("%s: the kept close makes %v, %v", c.name, again, err)
		}
	}
	if _, err := TailOf("no-number", nil); err == nil {
		t.Error("a message id without a number gave a tail")
	}
	if tail, err := TailOf(MsgID("a", 7), []byte("not an envelope")); err != nil || tail != (Tail{Last: 7}) {
		t.Errorf("an undecodable last event: %+v %v", tail, err)
	}
	if evs := (Tail{}).Closing(AgentRecord{Status: StatusIdle}, "node x restarted"); len(evs) != 2 {
		t.Errorf("an empty stream closes with %d events, want an error and status dead", len(evs))
	}
}

// A close the coordinator began and did not finish keeps what it needs
// to make its events again, the same.
func TestCloseLostKeepsItsEventsUntilStored(t *testing.T) {
	live := AgentRecord{ID: "a1", Node: "n1", Status: StatusWorking, Turn: 2, Held: 1, LastEvent: 9, Running: &Usage{OutputTokens: 3}}
	tail := Tail{Last: 9, Turn: 1}
	dead := CloseLost(live, tail, "node n1 was lost", CloserName)
	from, events, err := dead.ClosingEvents()
	if err != nil {
		t.Fatal(err)
	}
	_, want := tail.ClosingFrom(live)
	wantEvents := tail.Closing(live, "node n1 was lost")
	if from != want || fmt.Sprint(events) != fmt.Sprint(wantEvents) {
		t.Errorf("the kept close makes %d events after %d:\n%v\nthe close made %d after %d:\n%v", len(events), from, events, len(wantEvents), want, wantEvents)
	}
	if dead.Status != StatusDead || dead.LastEvent != from+uint64(len(events)) || dead.ClosedBy != CloserName {
		t.Errorf("the closing record: %+v", dead)
	}
	done := dead
	done.Closing = nil
	if _, evs, err := done.ClosingEvents(); evs != nil || err != nil {
		t.Errorf("a record keeping no close makes events: %v %v", evs, err)
	}
	// A close its record does not number to, or of turns far past what
	// its events could close, is not one CloseLost made: nothing is made
	// of it (a turn of 2^40 would be made into events until memory ran
	// out).
	for name, forged := range map[string]func(*AgentRecord){
		"from past the end":       func(r *AgentRecord) { r.Closing.From = 1 << 40 },
		"a turn far on":           func(r *AgentRecord) { r.Closing.Turn = 1 << 40 },
		"a tail's turn far on":    func(r *AgentRecord) { r.Closing.Tail.Turn = 1 << 40 },
		"more events than kept":   func(r *AgentRecord) { r.LastEvent-- },
		"fewer events than kept":  func(r *AgentRecord) { r.LastEvent++ },
		"past the most":           func(r *AgentRecord) { r.Closing.From = 0; r.LastEvent = MaxClosingEvents + 1 },
		"a reason past its bound": func(r *AgentRecord) { r.Closing.Why = strings.Repeat("x", 2000) },
	} {
		r := dead
		c := *dead.Closing
		r.Closing = &c
		forged(&r)
		if _, evs, err := r.ClosingEvents(); err == nil || evs != nil {
			t.Errorf("a close with %s made %d events", name, len(evs))
		}
	}
}

// A life none of whose events the stream holds is closed after the last
// number its record handed out when retention may have dropped them; a
// life the stream's retention has not reached (the stream holds its
// first message still, or its oldest is well before the life began) had
// none stored (its node died holding them), and its close numbers on
// from the stream: no gap where they would have been.
func TestClosingFromALifeWithNothingStored(t *testing.T) {
	born := 1_800_000_000.0
	rec := AgentRecord{ID: "a1", Status: StatusIdle, LastEvent: 1, EventsBefore: 0, CreatedAt: born}
	for name, c := range map[string]struct {
		tail Tail
		want uint64
	}{
		"retention unknown":                  {Tail{}, 1},
		"the stream whole":                   {Tail{Whole: true, Oldest: born}, 0},
		"the oldest an hour before the life": {Tail{Oldest: born - 3600}, 0},
		"the oldest just before the life":    {Tail{Oldest: born - 1}, 1},
		"the oldest after the life began":    {Tail{Oldest: born + 60}, 1},
	} {
		if _, n := c.tail.ClosingFrom(rec); n != c.want {
			t.Errorf("%s: the close numbers after %d, want %d", name, n, c.want)
		}
	}
}

// A life none of whose events is stored, on a stream that ends in an
// earlier life of the id (closed): the close numbers on from the earlier
// life, and that life's close is not taken for this one's.
func TestClosingFromAReopenedLifeWithNothingStored(t *testing.T) {
	rec := AgentRecord{ID: "a1", Status: StatusWorking, Turn: 2, TurnsBefore: 1, EventsBefore: 3, LastEvent: 5, CreatedAt: 1_800_000_000}
	for _, earlier := range []Tail{
		{Last: 3, Turn: 1, Ended: true},
		{Last: 3, Turn: 1, Ended: true, Dead: true},
		{Last: 2, Turn: 1, Open: true}, // the earlier life's end not stored
	} {
		tail, n := earlier.ClosingFrom(rec)
		if n != 3 || tail.Ended || tail.Dead || tail.Open || tail.Turn != 1 {
			t.Errorf("after %+v: the close numbers after %d (want 3) from %+v", earlier, n, tail)
		}
		evs := tail.Closing(rec, "node n1 was lost")
		if len(evs) == 0 || evs[len(evs)-1].Payload != (Status{Status: StatusDead}) {
			t.Fatalf("after %+v: the close is %+v", earlier, evs)
		}
		if evs[0].Turn != 2 || evs[0].Payload != (TurnStarted{}) {
			t.Errorf("after %+v: the close begins with %+v, not turn 2's start", earlier, evs[0])
		}
	}
}

// A restarted node closes a reopened life whose events its journal holds
// and sends first (none stored yet): the close numbers after the record's
// last event, not from the earlier life's end, where it took the journal's
// numbers and was dropped as their duplicate; and it closes this life,
// not taking the earlier life's death for its own.
func TestClosingFromAReopenedLifeAJournalHolds(t *testing.T) {
	rec := AgentRecord{ID: "a1", Status: StatusWorking, Turn: 2, TurnsBefore: 1, EventsBefore: 3, LastEvent: 9, CreatedAt: 1_800_000_000}
	tail := Tail{Last: 3, Turn: 1, Ended: true, Dead: true, Journaled: true}
	from, n := tail.ClosingFrom(rec)
	if n != 9 {
		t.Fatalf("the close numbers after %d; the journal holds up to 9", n)
	}
	evs := from.Closing(rec, "node n1 restarted")
	if len(evs) == 0 || evs[len(evs)-1].Payload != (Status{Status: StatusDead}) {
		t.Fatalf("the close of the new life: %+v", evs)
	}
}
