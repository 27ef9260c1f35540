package main

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// Strays on an agent's subject, published by a local client of a fabric
// without --auth (which trusts its clients, but must not break): a message
// without a number, a forged envelope numbered far ahead, a copy of an
// early event published after the duplicate window, and random bytes, with
// a number and without. A following `shoal tail`, agent_events,
// agent_output, the TUI and the Kaimon bus (a libzmq subscriber) each say
// what they skipped and then show the agent's next real turn in full; a
// reopened agent numbers on from its real last event.
func TestStraysOnTheStream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	url := "nats://127.0.0.1:" + port
	bus := "ipc://" + filepath.Join(dir, "bus.sock")
	up := startShoal(t, dir, nil, "up", "--port", port, "--no-node", "--mcp-listen", "127.0.0.1:0", "--bus", bus, "--stream-duplicates", "1s")
	up.waitLine("shoal: ready")
	sub := kaimonsub.Start(t, bus)

	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: "The first answer."}, fakemodel.Reply{Text: "The real second answer."}, fakemodel.Reply{Text: "A third, after the reopen."})
	home := filepath.Join(dir, "node")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	node := startShoal(t, home, env, "node", "--nats", url, "--name", "n1", "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms")
	node.waitLine("shoal: node n1 joined")
	cli := []string{"SHOAL_NATS=" + url}
	shoal := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), cli, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		return strings.TrimSpace(out)
	}
	const id = "drifter"
	shoal("open", "--id", id, t.TempDir())
	if out := shoal("run", id, "First."); out != "The first answer." {
		t.Fatalf("turn 1 answered %q", out)
	}

	// The readers, started before the strays.
	tail := startShoal(t, t.TempDir(), cli, "tail", id)
	tail.waitLine("") // it has printed the stored history
	scr := startTUI(t, append(baseEnv(t.TempDir()), "SHOAL_NATS="+url))
	scr.waitText("The first answer.")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stored := eventsPage(t, nc, id)
	last := stored.NextEvent - 1
	time.Sleep(1500 * time.Millisecond) // past the duplicate window: a copy is stored

	strays := []*nats.Msg{
		{Data: []byte(`{"kind":"assistant_text","turn":2,"data":{"delta":false,"content":{"type":"text","text":"UNNUMBERED"}}}`)},
		{Data: []byte(`{"kind":"assistant_text","turn":2,"data":{"delta":false,"content":{"type":"text","text":"FORGED"}}}`),
			Header: nats.Header{schemas.HeaderMsgID: {schemas.MsgID(id, 99999)}, schemas.HeaderNode: {"n1"}}},
		{Data: stored.Events[2].Event, Header: nats.Header{schemas.HeaderMsgID: {schemas.MsgID(id, 3)}, schemas.HeaderNode: {"n1"}}},
		{Data: []byte("\x00\xffnot json at all\x13")},
		{Data: []byte("\x7fgarbage"), Header: nats.Header{schemas.HeaderMsgID: {schemas.MsgID(id, 500000)}}},
	}
	for _, m := range strays {
		m.Subject = schemas.EventSubject(id)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	published := time.Now()

	if out := shoal("run", id, "Second."); out != "The real second answer." {
		t.Fatalf("turn 2 answered %q", out)
	}

	// shoal tail, following: the second turn in full, each stray named on
	// stderr, nothing of theirs on stdout.
	poll.Until(t, 30*time.Second, "tail shows the second turn's answer", func() bool {
		return strings.Contains(strings.Join(tail.stdoutLines(), "\n"), "The real second answer.")
	})
	out := strings.Join(tail.stdoutLines(), "\n")
	if strings.Contains(out, "FORGED") || strings.Contains(out, "UNNUMBERED") || strings.Contains(out, "garbage") {
		t.Errorf("tail printed a stray:\n%s", out)
	}
	if !strings.Contains(out, "turn 2") {
		t.Errorf("tail did not show turn 2 begin:\n%s", out)
	}
	poll.Until(t, 10*time.Second, "tail names the five strays", func() bool {
		return strings.Count(tail.stderrText(), "that is not one of its events") == len(strays)
	})
	for _, why := range []string{"it has no event number", "numbered 99999", "a copy of event 3", "it is not an event envelope"} {
		if !strings.Contains(tail.stderrText(), why) {
			t.Errorf("tail's stderr does not say %q:\n%s", why, tail.stderrText())
		}
	}

	// agent_events: every real event in order, the strays named.
	page := eventsPage(t, nc, id)
	for i, e := range page.Events {
		if e.N != uint64(i+1) {
			t.Fatalf("agent_events has event %d at %d", e.N, i)
		}
		schematest.Event(t, e.Event)
	}
	if len(page.Foreign) != len(strays) || len(page.Gaps) != 0 || page.Events[len(page.Events)-1].N != page.NextEvent-1 {
		t.Errorf("agent_events: %d events to %d, next %d, gaps %+v, foreign %+v", len(page.Events), page.Events[len(page.Events)-1].N, page.NextEvent, page.Gaps, page.Foreign)
	}
	if len(page.Events) <= int(last) || !strings.Contains(string(page.Events[len(page.Events)-1].Event), `"kind":"result"`) {
		t.Errorf("agent_events does not end with turn 2's result: %s", page.Events[len(page.Events)-1].Event)
	}

	// agent_output: the real answers only.
	if out := shoal("output", id); out != "The real second answer." {
		t.Errorf("output of the last turn: %q", out)
	}
	if out := shoal("output", "--which", "all", id); strings.Contains(out, "FORGED") || !strings.Contains(out, "The first answer.") || !strings.Contains(out, "The real second answer.") {
		t.Errorf("output of every turn: %q", out)
	}

	// The TUI: the strays as error lines, then the second turn.
	scr.wait("the strays and the second turn", func(s string) bool {
		return strings.Contains(s, "not one of its events") && strings.Contains(s, "The real second answer.") && !strings.Contains(s, "FORGED")
	})

	// The Kaimon bus: exactly the agent's events, in order, byte for byte.
	for i, e := range page.Events {
		m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d of %d", i+1, len(page.Events)))
		if m.Channel != "agent:"+id || m.Data != string(e.Event) {
			t.Fatalf("bus message %d is %s %.100q, want event %d %.100q", i+1, m.Channel, m.Data, e.N, e.Event)
		}
	}

	// Strays at the end of the stream, then a reopen: the agent numbers on
	// from its real last event.
	shoal("close", id)
	closed := eventsPage(t, nc, id).NextEvent
	// Past the duplicate window of the first strays, so the numbered one
	// is stored again rather than dropped as a duplicate.
	time.Sleep(time.Until(published.Add(1500 * time.Millisecond)))
	for _, m := range strays[:2] {
		m.Subject = schemas.EventSubject(id)
		nc.PublishMsg(m)
	}
	nc.Flush()
	shoal("open", "--id", id, t.TempDir())
	if out := shoal("run", id, "Third."); out != "A third, after the reopen." {
		t.Fatalf("turn 3 answered %q", out)
	}
	page = eventsPage(t, nc, id)
	for i, e := range page.Events {
		if e.N != uint64(i+1) {
			t.Fatalf("after the reopen, agent_events has event %d at %d (the reopened life started at %d)", e.N, i, closed)
		}
	}
	if len(page.Gaps) != 0 || len(page.Foreign) != len(strays)+2 {
		t.Errorf("after the reopen: gaps %+v, %d foreign", page.Gaps, len(page.Foreign))
	}
}

// eventsPage reads every event of an agent through the fabric service.
func eventsPage(t *testing.T, nc *nats.Conn, id string) schemas.EventsReply {
	t.Helper()
	body, _ := json.Marshal(schemas.EventsRequest{AgentID: id, Max: 5000, IncludeDeltas: true})
	msg, err := nc.Request(schemas.FabricSubject("events"), body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.EventsReply
	if err := schemas.DecodeReply(msg.Data, &rep); err != nil {
		t.Fatalf("events: %v", err)
	}
	return rep
}
