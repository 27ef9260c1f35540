package client

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// ev is event n of agent a at stream sequence seq.
func ev(a string, seq, n uint64, p schemas.Payload) Replayed {
	raw, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p})
	if err != nil {
		panic(err)
	}
	kind, turn, delta, _ := schemas.Peek(raw)
	return Replayed{Agent: a, Seq: seq, N: n, Raw: raw, Kind: kind, Turn: turn, Delta: delta}
}

func text(a string, seq, n uint64) Replayed {
	return ev(a, seq, n, schemas.AssistantText{Content: schemas.Text(fmt.Sprint("t", n))})
}

// said renders what a sequencer delivered: n, n after a gap (n/gap a-b),
// or a stray (!n).
func said(ds []delivery) string {
	var out []string
	for _, d := range ds {
		switch {
		case d.r.Stray != "":
			out = append(out, fmt.Sprintf("!%d", d.r.N))
		case d.gap != nil:
			out = append(out, fmt.Sprintf("%d/gap %d-%d", d.r.N, d.gap.From, d.gap.To))
		default:
			out = append(out, fmt.Sprint(d.r.N))
		}
	}
	return strings.Join(out, " ")
}

// The order a reader keeps: each agent's events in number order, strays
// skipped and named, a jump held until the next event tells whether it
// was a stray or a gap.
func TestSequencer(t *testing.T) {
	ctx := context.Background()
	feed := func(q *sequencer, rs ...Replayed) string {
		var all []delivery
		for _, r := range rs {
			ds, err := q.add(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ds...)
		}
		return said(append(all, q.flush()...))
	}
	noNumber := Replayed{Agent: "a", Seq: 50, Stray: strayNoNumber}
	lost := ev("a", 9, 2000, schemas.LostRangeError("a", 1, 4, 1999).Payload)
	for _, c := range []struct {
		name string
		in   []Replayed
		want string
	}{
		{"in order", []Replayed{text("a", 1, 1), text("a", 2, 2), text("a", 3, 3)}, "1 2 3"},
		{"strays by their form", []Replayed{text("a", 1, 1), noNumber, text("a", 3, 2)}, "1 !0 2"},
		{"a copy", []Replayed{text("a", 1, 1), text("a", 2, 2), text("a", 3, 1), text("a", 4, 3)}, "1 2 !1 3"},
		{"a forgery far ahead, then the real next", []Replayed{text("a", 1, 1), text("a", 2, 99999), text("a", 3, 2), text("a", 4, 3)}, "1 !99999 2 3"},
		{"a forgery far ahead, last", []Replayed{text("a", 1, 1), text("a", 2, 99999)}, "1 !99999"},
		{"a jump the next event confirms", []Replayed{text("a", 1, 1), text("a", 2, 5), text("a", 3, 6)}, "1 5/gap 2-4 6"},
		{"two forgeries apart", []Replayed{text("a", 1, 1), text("a", 2, 50), text("a", 3, 70), text("a", 4, 2)}, "1 !50 !70 2"},
		{"a lost range explains itself", []Replayed{text("a", 1, 1), text("a", 2, 2), text("a", 3, 3), lost, text("a", 10, 2001)}, "1 2 3 2000/gap 4-1999 2001"},
		{"the stored history starts late", []Replayed{text("a", 7, 40), text("a", 8, 41)}, "40/gap 1-39 41"},
		{"agents apart", []Replayed{text("a", 1, 1), text("b", 2, 1), text("a", 3, 2), text("b", 4, 3), text("b", 5, 2)}, "1 1 2 !3 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := feed(newSequencer(true, nil), c.in...); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}

	// A reader that starts mid-stream finds where the agent stands before
	// the first message it meets, so a forgery there is not taken for the
	// agent's position.
	anchored := newSequencer(false, func(_ context.Context, agent string, before uint64) (uint64, bool, error) {
		if agent == "a" && before == 20 {
			return 11, true, nil
		}
		return 0, false, nil
	})
	if got := feed(anchored, text("a", 20, 99999), text("a", 21, 12), text("a", 22, 13)); got != "!99999 12 13" {
		t.Errorf("anchored: got %q", got)
	}
	fresh := newSequencer(false, func(context.Context, string, uint64) (uint64, bool, error) { return 0, false, nil })
	if got := feed(fresh, text("a", 1, 1), text("a", 2, 2)); got != "1 2" {
		t.Errorf("no history: got %q", got)
	}
	from := newSequencer(false, nil)
	from.expect("a", 7)
	if got := feed(from, text("a", 30, 7), text("a", 31, 8)); got != "7 8" {
		t.Errorf("from event 7: got %q", got)
	}
}
