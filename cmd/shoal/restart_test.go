package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// The coordinator killed with SIGKILL mid-turn and restarted: the agent on
// its remote node keeps working, its events wait in the node's outbox,
// and the turn ends up complete and ordered on the stream and on the
// Kaimon bus, nothing lost and nothing doubled.
func TestCoordinatorKilledMidTurn(t *testing.T) {
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
	coordinator := func() *shoalProc {
		p := startShoal(t, dir, nil, "up", "--port", port, "--no-node", "--mcp-listen", "127.0.0.1:0", "--bus", bus)
		p.waitLine("shoal: ready")
		return p
	}
	up := coordinator()
	sub := kaimonsub.Start(t, bus)

	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: strings.Repeat("steady ", 90), ChunkSize: 14, Delay: 100 * time.Millisecond})
	nodeHome := filepath.Join(dir, "node")
	env := append(peers.ClaudeEnv(filepath.Join(nodeHome, "claude"), fake.URL()), "XDG_CACHE_HOME="+nodeHome+"/cache")
	node := startShoal(t, nodeHome, env, "node", "--nats", url, "--name", "remote", "--claude", peers.Claude.Command(t)[0])
	node.waitLine("shoal: node remote joined")
	client := []string{"SHOAL_NATS=" + url}
	code, out, errOut := runShoal(t, t.TempDir(), client, "open", t.TempDir())
	if code != 0 {
		t.Fatalf("open: %s", errOut)
	}
	id := strings.TrimSpace(out)
	if code, _, errOut := runShoal(t, t.TempDir(), client, "send", id, "Keep going."); code != 0 {
		t.Fatalf("send: %s", errOut)
	}
	poll.Until(t, 60*time.Second, "the turn streams", func() bool { return streaming(t, url, id) })

	killed := time.Now()
	if code := up.stop(syscall.SIGKILL); code != -1 {
		t.Logf("the coordinator exited %d", code)
	}
	// The node notices, and its outbox holds the turn's events meanwhile.
	poll.Until(t, 30*time.Second, "the node keeps events for later", func() bool {
		return strings.Contains(node.stderrText(), "storing events failed; retrying")
	})
	back := time.Now()
	coordinator()

	// The turn finishes; its stream is whole.
	var evs []schemas.Event
	var raws []string
	var whileDown int // events the node made while the coordinator was away
	poll.Until(t, 90*time.Second, "the turn's result is stored", func() bool {
		evs, raws, whileDown = nil, nil, 0
		nc, err := nats.Connect(url)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		s, err := js.Stream(t.Context(), schemas.StreamName)
		if err != nil {
			return false
		}
		cons, err := s.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
		if err != nil {
			return false
		}
		var last uint64
		for {
			m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				break
			}
			_, n, err := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID))
			if err != nil || n != last+1 {
				t.Fatalf("event %d follows %d in the stream (%v)", n, last, err)
			}
			last = n
			if at, err := time.Parse(time.RFC3339Nano, m.Headers().Get(schemas.HeaderTime)); err == nil && at.After(killed) && at.Before(back) {
				whileDown++
			}
			schematest.Event(t, m.Data())
			ev, err := schemas.Decode(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			evs, raws = append(evs, ev), append(raws, string(m.Data()))
		}
		return len(evs) > 0 && evs[len(evs)-1].Kind() == schemas.KindResult
	})
	var kinds []string
	for _, ev := range evs {
		if !ev.IsDelta() {
			kinds = append(kinds, fmt.Sprintf("%s@%d", ev.Kind(), ev.Turn))
		}
	}
	want := "status@0 user_text@0 status@1 turn_started@1 assistant_text@1 status@1 result@1"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("the stream holds %s, want %s", got, want)
	}
	if r := evs[len(evs)-1].Payload.(schemas.Result); r.StopReason != schemas.StopEndTurn {
		t.Errorf("the turn ended %s", r.StopReason)
	}
	if whileDown == 0 {
		t.Errorf("no stored event was made while the coordinator was down; the outbox was never used")
	}
	// The Kaimon bus carried every event once, in order, across the restart.
	for i, raw := range raws {
		m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d of %d", i+1, len(raws)))
		schematest.Event(t, []byte(m.Data))
		if m.Data != raw || m.Channel != "agent:"+id {
			t.Fatalf("bus event %d is %.80q, want %.80q", i+1, m.Data, raw)
		}
	}
	select {
	case m := <-sub:
		t.Fatalf("an extra event on the bus: %.80q", m.Data)
	case <-time.After(500 * time.Millisecond):
	}
}
