package tui

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// flakyFabric's follows do what the test tells them, one step per call,
// and say where each was asked to start.
type flakyFabric struct {
	fakeSource
	froms chan Resume
	steps chan func(fn func(Event)) error
}

func (f *flakyFabric) Follow(ctx context.Context, from Resume, fn func(Event)) error {
	f.froms <- from
	select {
	case step := <-f.steps:
		return step(fn)
	case <-ctx.Done():
		return nil
	}
}

func within[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// A lost live feed is followed again, after a pause, from where it
// stood: from the time of the last event seen, without the events seen
// already; the status line says it reconnects, then that it is back.
func TestFollowResumes(t *testing.T) {
	src := &flakyFabric{froms: make(chan Resume, 1), steps: make(chan func(func(Event)) error)}
	m := New(t.Context(), src, Options{})
	m.Update(agentsMsg{{ID: "a", Node: "n1"}, {ID: "b", Node: "n1"}})
	go m.follow()

	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	stored := func(agent string, n uint64, s int) Event {
		e := ev(agent, n, schemas.AssistantText{Content: schemas.Text(agent + " says " + string(rune('0'+n)))})
		e.Stored = at(s)
		return e
	}
	if from := within(t, src.froms, "first follow"); !from.Since.IsZero() || len(from.Last) != 0 {
		t.Fatalf("the first follow starts at %+v, not now", from)
	}
	src.steps <- func(fn func(Event)) error {
		fn(stored("a", 1, 1))
		fn(stored("a", 2, 2))
		fn(stored("b", 7, 3))
		return errors.New("nats: connection closed")
	}
	var got []string
	for range 3 {
		in := within(t, m.events, "an event")
		got = append(got, in.ev.Agent+string(rune('0'+in.ev.N)))
	}
	lost := within(t, m.feedStates, "the loss")
	if lost.lost == nil || !strings.Contains(lost.lost.Error(), "connection closed") {
		t.Fatalf("the follower said %+v", lost)
	}
	m.Update(feedMsg(lost))
	screenHas := func(want string) {
		t.Helper()
		m.width, m.height = 160, 20
		if f := m.footer(); !strings.Contains(f, want) {
			t.Fatalf("the status line is %q, not %q", f, want)
		}
	}
	screenHas("reconnecting…")

	from := within(t, src.froms, "a second follow")
	if !from.Since.Equal(at(3)) || !reflect.DeepEqual(from.Last, map[string]uint64{"a": 2, "b": 7}) {
		t.Fatalf("the second follow starts at %+v", from)
	}
	src.steps <- func(fn func(Event)) error {
		fn(stored("a", 2, 2)) // had
		fn(stored("b", 7, 3)) // had
		fn(stored("a", 3, 4))
		fn(stored("c", 1, 5)) // an agent first seen after the loss
		<-t.Context().Done()
		return nil
	}
	if back := within(t, m.feedStates, "the feed back"); !back.back {
		t.Fatalf("the follower said %+v", back)
	}
	for range 2 {
		in := within(t, m.events, "an event after the loss")
		got = append(got, in.ev.Agent+string(rune('0'+in.ev.N)))
	}
	if strings.Join(got, " ") != "a1 a2 b7 a3 c1" {
		t.Fatalf("the monitor got %v", got)
	}
	select {
	case in := <-m.events:
		t.Fatalf("an extra event: %+v", in)
	default:
	}
	m.Update(feedMsg{back: true})
	screenHas("the live feed is back")
}
