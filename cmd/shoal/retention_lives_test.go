package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A reopened id goes on from its last event and turn, and a number handed
// out is never handed out again: once the stream's retention had dropped
// a closed agent's events (its record, which said turn 1, still there),
// a reopen started its numbering over, events 1, 2, ... and turn 1
// again, and an observer resuming from the event after the last it saw
// skipped the new life's first events. The claim that reopens an id
// carries where its earlier lives' numbering ended.
func TestReopenAfterRetentionNumbersOn(t *testing.T) {
	retention := []string{"--stream-duplicates", "1s", "--stream-max-age", "3s"}
	t.Run("a node with the fabric's rights", func(t *testing.T) {
		t.Parallel()
		fake, cli, url := plainFabric(t, retention...)
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		reopenAfterRetention(t, fake, cli, nc)
	})
	// A confined node's events go through the coordinator's relay, which
	// stores each agent's next number only: it takes the new life's
	// numbers after the earlier lives' too.
	t.Run("a confined node", func(t *testing.T) {
		t.Parallel()
		p := startAuthPool(t, "coordinator", "ops", retention...)
		nc, err := nats.Connect(p.url, nats.UserCredentials(p.creds["ops"]))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		reopenAfterRetention(t, p.fake, p.as, nc)
	})
}

// reopenAfterRetention runs an agent's turn, closes it, waits for the
// stream's retention to drop its events, reopens it and runs another,
// as a caller with the environment cli; nc reads the agent's events.
func reopenAfterRetention(t *testing.T, fake *fakemodel.Server, cli []string, nc *nats.Conn) {
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eventsPage := func(t *testing.T, _ *nats.Conn, id string) schemas.EventsReply {
		t.Helper()
		rep, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: id, Max: 5000, IncludeDeltas: true})
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		return rep
	}
	fake.Script(fakemodel.Reply{Text: "The first answer."}, fakemodel.Reply{Text: "An answer after the reopen."})
	shoal := mustShoal(t, cli)
	const id = "aged"
	shoal("open", "--id", id, t.TempDir())
	if out := shoal("run", id, "First."); out != "The first answer." {
		t.Fatalf("turn 1 answered %q", out)
	}
	shoal("close", id)
	seen := eventsPage(t, nc, id).NextEvent - 1 // an observer saw every event
	t.Logf("the first life ended at event %d", seen)

	// Retention drops the closed agent's events.
	poll.Until(t, 30*time.Second, "retention drops the first life", func() bool {
		return len(eventsPage(t, nc, id).Events) == 0
	})

	shoal("open", "--id", id, t.TempDir())
	var rep struct {
		Text string `json:"text"`
		Turn int    `json:"turn"`
	}
	if err := json.Unmarshal([]byte(shoal("run", "--json", id, "Again.")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Turn <= 1 {
		t.Errorf("the reopened life's first turn is turn %d: turn 1 was handed out before", rep.Turn)
	}
	page := eventsPage(t, nc, id)
	if len(page.Events) == 0 || page.Events[0].N <= seen {
		first := uint64(0)
		if len(page.Events) > 0 {
			first = page.Events[0].N
		}
		t.Errorf("the reopened life numbers from %d; the first life's last event was %d", first, seen)
	}
	// The observer resumes where it stopped: it must get the new life from its first event.
	code, out, errOut := runShoal(t, t.TempDir(), cli, "tail", "--no-follow", "--json", "--from", strconv.FormatUint(seen+1, 10), id)
	if !strings.Contains(out, "Again.") {
		t.Errorf("an observer resuming at %d misses the reopened life's prompt (exit %d, stderr %q):\n%s", seen+1, code, errOut, out)
	}
}

// plainFabric starts shoal up without credentials (no node, no bus) with
// upArgs, and one shoal node, n1, running the pinned claude CLI against a
// fake model. It returns the model, a caller's environment and the
// fabric's URL.
func plainFabric(t *testing.T, upArgs ...string) (*fakemodel.Server, []string, string) {
	t.Helper()
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	url := "nats://127.0.0.1:" + port
	up := startShoal(t, dir, nil, append([]string{"up", "--port", port, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0"}, upArgs...)...)
	up.waitLine("shoal: ready")
	fake := fakemodel.Start(t, fakemodel.Config{})
	home := filepath.Join(dir, "node")
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache")
	node := startShoal(t, home, env, "node", "--nats", url, "--name", "n1", "--claude", peers.Claude.Command(t)[0], "--stop-wait", "500ms")
	node.waitLine("shoal: node n1 joined")
	return fake, []string{"SHOAL_NATS=" + url}, url
}

// mustShoal runs a caller's shoal command, with the environment cli, that
// must succeed, and returns its output, trimmed.
func mustShoal(t *testing.T, cli []string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), cli, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		return strings.TrimSpace(out)
	}
}
