package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal tail --from replays from an event number, a turn or a time, and
// the coordinator answers pages of events over NATS.
func TestTailFromAndEventsRequest(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: "One."}, fakemodel.Reply{Text: "Two."}, fakemodel.Reply{Text: "Three."})
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus", "--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: %s", args, errOut)
		}
		return out
	}
	opened := must("open", "--json", t.TempDir())
	schematest.Control(t, "open_reply", []byte(opened))
	var open schemas.OpenReply
	if err := json.Unmarshal([]byte(opened), &open); err != nil {
		t.Fatal(err)
	}
	id := open.AgentID
	schematest.Control(t, "run_reply", []byte(must("run", "--json", id, "first")))
	mid := time.Now()
	must("run", id, "second")
	must("run", id, "third")

	all := strings.Split(strings.TrimSpace(must("tail", "--no-follow", "--raw", id)), "\n")
	if len(all) < 20 {
		t.Fatalf("tail --no-follow printed %d events", len(all))
	}
	for _, line := range all {
		schematest.Event(t, []byte(line))
	}
	from5 := strings.Split(strings.TrimSpace(must("tail", "--no-follow", "--raw", "--from", "5", id)), "\n")
	if len(from5) != len(all)-4 || from5[0] != all[4] {
		t.Errorf("--from 5: %d events starting %q", len(from5), from5[0])
	}
	for _, line := range from5 {
		schematest.Event(t, []byte(line))
	}
	turn2 := must("tail", "--no-follow", "--from", "turn:2", id)
	if strings.Contains(turn2, "One.") || !strings.HasPrefix(turn2, "» second") || !strings.Contains(turn2, "Three.") {
		t.Errorf("--from turn:2:\n%s", turn2)
	}
	since := must("tail", "--no-follow", "--from", mid.UTC().Format(time.RFC3339Nano), id)
	if strings.Contains(since, "One.") || !strings.Contains(since, "Two.") {
		t.Errorf("--from a time:\n%s", since)
	}
	for _, c := range []struct{ from, want string }{
		{"0", "event numbers start at 1"},
		{"turn:x", "a turn is turn:N"},
		{"yesterday", "is not start, new, an event number"},
	} {
		if code, _, errOut := runShoal(t, t.TempDir(), client, "tail", "--from", c.from, id); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("--from %s: exit %d %q", c.from, code, errOut)
		}
	}
	if code, _, errOut := runShoal(t, t.TempDir(), client, "tail", "--from", "3"); code != 2 || !strings.Contains(errOut, "needs exactly one agent") {
		t.Errorf("--from 3 without an agent: %q", errOut)
	}

	// The same over NATS, a page at a time.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var pages []schemas.StoredEvent
	next := uint64(1)
	for {
		body, _ := json.Marshal(schemas.EventsRequest{AgentID: id, FromEvent: next, Max: 7, IncludeDeltas: true})
		msg, err := nc.Request(schemas.FabricSubject("events"), body, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		schematest.Control(t, "events_reply", msg.Data)
		var rep schemas.EventsReply
		if err := schemas.DecodeReply(msg.Data, &rep); err != nil {
			t.Fatal(err)
		}
		for _, e := range rep.Events {
			schematest.Event(t, e.Event)
		}
		pages = append(pages, rep.Events...)
		if !rep.More {
			break
		}
		next = rep.NextEvent
	}
	if len(pages) != len(all) || pages[len(pages)-1].N != uint64(len(all)) || string(pages[3].Event) != all[3] {
		t.Errorf("paged %d events, tail saw %d", len(pages), len(all))
	}
	msg, err := nc.Request(schemas.FabricSubject("events"), []byte(`{"agent_id":"`+id+`","from_event":2,"since":"2026-01-01T00:00:00Z"}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	schematest.Control(t, "error_reply", msg.Data)
	if !strings.Contains(string(msg.Data), "give at most one of from_event, from_turn and since") {
		t.Errorf("two starting points: %s", msg.Data)
	}
}
