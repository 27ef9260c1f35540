package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A living agent whose every event has aged out of the stream (idle past
// --stream-max-age) is not taken for an agent without events: its record
// says how far it numbered. A read of its history says the events are gone
// (a gap, on stderr for shoal tail, in agent_events' gaps, whose next_event
// goes on after them); shoal output of a turn says it is past retention;
// --from an event retention dropped is no "past the end"; and a stopped
// observer resumes with --from <last + 1>, printing the next turn.
func TestReadersOfAnAgentWhoseEventsAllAgedOut(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--stream-max-age", "3s", "--stream-duplicates", "1s")
	c.fake.Script(fakemodel.Reply{Text: "The first answer."})
	id := "agedout"
	c.must("open", "--id", id, "--permission", "bypass", t.TempDir())
	if out := c.must("run", id, "First."); out != "The first answer." {
		t.Fatalf("turn 1 answered %q", out)
	}
	var last uint64
	for l := range strings.Lines(c.must("tail", id, "--no-follow", "--raw")) {
		if strings.TrimSpace(l) != "" {
			last++
		}
	}
	if last == 0 {
		t.Fatal("no events stored")
	}
	// The tail just after the run may not hold the turn's last events
	// yet (an idle status stored after the reply): the range said is
	// read from the message, and may not be short of what was counted.
	gone := regexp.MustCompile("agent " + id + "'s events 1 to ([0-9]+) are missing from the stream")
	var errOut string
	poll.Until(t, 60*time.Second, "a read of the agent's history says retention dropped it", func() bool {
		var out string
		_, out, errOut = c.shoal("tail", id, "--no-follow", "--raw")
		return out == "" && gone.MatchString(errOut)
	})
	said, _ := strconv.ParseUint(gone.FindStringSubmatch(errOut)[1], 10, 64)
	if said < last {
		t.Fatalf("shoal tail says events 1 to %d are gone; %d were read before they aged out: %s", said, last, errOut)
	}
	last = said
	if !strings.Contains(errOut, "its next event is "+strconv.FormatUint(last+1, 10)) {
		t.Errorf("shoal tail of the aged-out agent says %q", errOut)
	}

	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	page, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: id, IncludeDeltas: true})
	if err != nil || len(page.Events) != 0 || len(page.Gaps) != 1 || page.Gaps[0] != (schemas.EventGap{From: 1, To: last}) || page.NextEvent != last+1 {
		t.Errorf("agent_events of an agent whose %d events all aged out: %+v, %v; want them named as a gap and next_event %d", last, page, err, last+1)
	}
	code, out, errOut := c.shoal("output", id, "--turn", "1")
	if code == 0 || !strings.Contains(errOut, "past the stream's retention") {
		t.Errorf("shoal output --turn 1: exit %d, stdout %q, stderr %q; want it to say the turn is past the stream's retention", code, out, errOut)
	}
	code, _, errOut = c.shoal("tail", id, "--from", "2", "--no-follow")
	if code != 0 || !strings.Contains(errOut, "events 2 to "+strconv.FormatUint(last, 10)+" are missing") {
		t.Errorf("shoal tail --from 2 of an agent that numbered %d events: exit %d, %q; want the dropped events named", last, code, strings.TrimSpace(errOut))
	}
	next := strconv.FormatUint(last+1, 10)
	if code, _, errOut = c.shoal("tail", id, "--from", next, "--no-follow"); code != 0 || errOut != "" {
		t.Errorf("shoal tail --from %s (the agent's next event) --no-follow: exit %d, %q; want nothing to print and exit 0", next, code, strings.TrimSpace(errOut))
	}
	tail := startShoal(t, t.TempDir(), c.client, "tail", id, "--from", next, "--raw")
	c.fake.Script(fakemodel.Reply{Text: "After the silence."})
	c.must("send", id, "Again.")
	tail.waitLineWithin(`{"kind":"result"`, 60*time.Second)
}
