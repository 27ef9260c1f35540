package schemas

import "testing"

func TestTailOrphaned(t *testing.T) {
	enc := func(ev Event) []byte {
		b, err := Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name    string
		last    Event
		working bool   // what the agent's record says
		kinds   []Kind // what Orphaned(5, ...) returns
		turn    int    // the turn of what it returns
	}{
		{"mid-turn", Event{Turn: 3, Payload: AssistantText{Delta: true, Content: Text("x")}}, false, []Kind{KindError, KindResult, KindStatus}, 3},
		{"working", Event{Turn: 3, Payload: Status{Status: StatusWorking}}, false, []Kind{KindError, KindResult, KindStatus}, 3},
		{"after a result", Event{Turn: 3, Payload: Result{StopReason: StopEndTurn}}, false, []Kind{KindError, KindStatus}, 5},
		{"idle", Event{Turn: 3, Payload: Status{Status: StatusIdle}}, false, []Kind{KindError, KindStatus}, 5},
		{"a user's text", Event{Turn: 3, Payload: UserText{Content: Text("q")}}, false, []Kind{KindError, KindStatus}, 5},
		{"dead", Event{Turn: 3, Payload: Status{Status: StatusDead}}, false, nil, 0},
		{"closed", Event{Turn: 3, Payload: Status{Status: StatusClosed}}, false, nil, 0},
		{"an error between turns", Event{Turn: 3, Payload: Errorf("unreadable")}, false, []Kind{KindError, KindStatus}, 5},
		{"an error in a turn", Event{Turn: 3, Payload: Errorf("unreadable")}, true, []Kind{KindError, KindResult, KindStatus}, 3},
	}
	for _, c := range cases {
		tail, err := TailOf(MsgID("a", 42), enc(c.last))
		if err != nil || tail.Last != 42 {
			t.Fatalf("%s: %+v %v", c.name, tail, err)
		}
		evs := tail.Orphaned(5, c.working, "node x was lost")
		if len(evs) != len(c.kinds) {
			t.Errorf("%s: %d closing events, want %d", c.name, len(evs), len(c.kinds))
			continue
		}
		for i, ev := range evs {
			if ev.Kind() != c.kinds[i] || ev.Turn != c.turn {
				t.Errorf("%s: event %d is %s@%d, want %s@%d", c.name, i, ev.Kind(), ev.Turn, c.kinds[i], c.turn)
			}
		}
		if len(evs) == 3 {
			if e := evs[0].Payload.(Error); e.Message != "node x was lost during turn 3; the turn cannot finish" {
				t.Errorf("%s: %q", c.name, e.Message)
			}
			if r := evs[1].Payload.(Result); r.StopReason != StopCancelled {
				t.Errorf("%s: result %s", c.name, r.StopReason)
			}
		}
		if len(evs) == 2 && evs[0].Payload.(Error).Message != "node x was lost; the agent is gone with it" {
			t.Errorf("%s: %q", c.name, evs[0].Payload.(Error).Message)
		}
		if len(evs) > 0 && evs[len(evs)-1].Payload.(Status).Status != StatusDead {
			t.Errorf("%s: the last closing event is not status dead", c.name)
		}
	}
	if _, err := TailOf("no-number", nil); err == nil {
		t.Error("a message id without a number gave a tail")
	}
	if tail, err := TailOf(MsgID("a", 7), []byte("not an envelope")); err != nil || tail != (Tail{Last: 7}) {
		t.Errorf("an undecodable last event: %+v %v", tail, err)
	}
	if evs := (Tail{}).Orphaned(0, false, "node x restarted"); len(evs) != 2 {
		t.Errorf("an empty stream closes with %d events, want an error and status dead", len(evs))
	}
}
