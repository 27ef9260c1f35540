package main

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// A reopened agent numbers on from its real last event. 65 unnumbered
// messages published on a closed agent's subject (any local client of a
// fabric without --auth) hid its last event from the node that reopened
// it: the new life numbered from 1 again, and every reader took the new
// life's events for copies of the first life's and skipped them. The
// claim that reopens an id carries where its numbering ended.
func TestStrayRunDoesNotRestartTheNumbering(t *testing.T) {
	t.Parallel()
	fake, cli, url := plainFabric(t, "--stream-duplicates", "1s")
	fake.Script(fakemodel.Reply{Text: "The first answer."}, fakemodel.Reply{Text: "An answer after the reopen."})
	shoal := mustShoal(t, cli)
	const id = "lives"
	shoal("open", "--id", id, t.TempDir())
	if out := shoal("run", id, "First."); out != "The first answer." {
		t.Fatalf("turn 1 answered %q", out)
	}
	shoal("close", id)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	first := eventsPage(t, nc, id)
	last := first.NextEvent - 1

	for i := range 65 {
		m := nats.NewMsg(schemas.EventSubject(id))
		m.Data = fmt.Appendf(nil, `{"note":%d}`, i)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()

	shoal("open", "--id", id, t.TempDir())
	if out := shoal("run", id, "Again."); out != "An answer after the reopen." {
		t.Fatalf("the reopened agent's turn answered %q", out)
	}
	page := eventsPage(t, nc, id)
	for i, e := range page.Events {
		if e.N != uint64(i+1) {
			t.Fatalf("agent_events has event %d at %d (the first life ended at %d)", e.N, i, last)
		}
	}
	if n := page.Events[len(page.Events)-1].N; n <= last+2 {
		t.Errorf("agent_events ends at event %d, the first life's last was %d: the reopened life is missing (%d foreign: %+v)", n, last, len(page.Foreign), page.Foreign[len(page.Foreign)-1])
	}
	if out := shoal("output", id); out != "An answer after the reopen." {
		t.Errorf("shoal output after the reopen: %q", out)
	}
}
