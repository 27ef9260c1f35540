package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// Three coordinators in one NATS cluster keep the stream and buckets in
// three replicas. The server a node is connected to is killed with
// SIGKILL in the middle of a turn: the node moves to another member, the
// turn completes, and replay from a surviving member is complete and in
// order.
func TestClusterSurvivesAKilledMember(t *testing.T) {
	t.Parallel()
	var ports []int
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		l.Close()
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	dir := t.TempDir()
	members := make([]*shoalProc, 3)
	urls := make([]string, 3)
	for i := range members {
		home := filepath.Join(dir, fmt.Sprintf("s%d", i))
		members[i] = startShoal(t, home, nil, "up", "--port", "-1", "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0",
			"--cluster", "shoal-test", "--server-name", fmt.Sprintf("s%d", i),
			"--cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--routes", strings.Join(routes, ","),
			"--node-ttl", "10s", "--stream-max-bytes", "64MiB")
	}
	for i, m := range members {
		urls[i] = strings.TrimPrefix(m.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	}
	for _, m := range members {
		m.waitLineWithin("shoal: ready", 120*time.Second)
	}

	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(fakemodel.Reply{Text: strings.Repeat("steady ", 90), ChunkSize: 14, Delay: 100 * time.Millisecond})
	nodeHome := filepath.Join(dir, "node")
	env := append(peers.ClaudeEnv(filepath.Join(nodeHome, "claude"), fake.URL()), "XDG_CACHE_HOME="+nodeHome+"/cache")
	node := startShoal(t, nodeHome, env, "node", "--nats", urls[0], "--name", "worker", "--claude", peers.Claude.Command(t)[0])
	node.waitLine("shoal: node worker joined")

	client := []string{"SHOAL_NATS=" + urls[1]}
	var id string
	poll.Until(t, 30*time.Second, "placement sees the node", func() bool {
		code, out, _ := runShoal(t, t.TempDir(), client, "open", t.TempDir())
		id = strings.TrimSpace(out)
		return code == 0
	})
	if code, _, errOut := runShoal(t, t.TempDir(), client, "send", id, "Keep going."); code != 0 {
		t.Fatalf("send: %s", errOut)
	}
	poll.Until(t, 60*time.Second, "the turn streams", func() bool { return streaming(t, urls[1], id) })

	members[0].stop(syscall.SIGKILL)

	// The turn finishes; replay from a surviving member is whole.
	var evs []schemas.Event
	poll.Until(t, 120*time.Second, "the turn's result is stored", func() bool {
		var err error
		evs, err = storedEvents(t, urls[2], id)
		if err != nil {
			t.Logf("%s: %v", time.Now().Format(time.TimeOnly), err)
			return false
		}
		return len(evs) > 0 && evs[len(evs)-1].Kind() == schemas.KindResult
	})
	var kinds []string
	var text string
	for _, ev := range evs {
		if !ev.IsDelta() {
			kinds = append(kinds, fmt.Sprintf("%s@%d", ev.Kind(), ev.Turn))
		}
		if a, ok := ev.Payload.(schemas.AssistantText); ok && !a.Delta {
			text = a.Content.Text
		}
	}
	want := "status@0 user_text@0 status@1 turn_started@1 assistant_text@1 status@1 result@1"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("the stream holds %s, want %s", got, want)
	}
	if strings.TrimSpace(text) != strings.TrimSpace(strings.Repeat("steady ", 90)) {
		t.Errorf("the turn's text is %q", text)
	}
	// The fabric still answers through the survivors, once they have
	// moved the buckets' leaders.
	var out, errOut string
	poll.Until(t, 60*time.Second, "output through a survivor", func() bool {
		var code int
		code, out, errOut = runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + urls[2]}, "output", id)
		return code == 0
	})
	if !strings.HasPrefix(strings.TrimSpace(out), "steady steady") {
		t.Errorf("output through a survivor: %q %s", out, errOut)
	}
}

// storedEvents reads an agent's events from the stream through url,
// checking that they are numbered without a gap.
func storedEvents(t *testing.T, url, id string) ([]schemas.Event, error) {
	ctx := natstest.Context(t, 10*time.Second)
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Config.Replicas != 3 {
		t.Fatalf("the stream has %d replicas", info.Config.Replicas)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: schemas.EventSubject(id), AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, err
	}
	defer s.DeleteConsumer(context.Background(), cons.CachedInfo().Name)
	var evs []schemas.Event
	var last uint64
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			_, n, err := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID))
			if err != nil || n != last+1 {
				t.Fatalf("event %d follows %d in the stream (%v)", n, last, err)
			}
			last = n
			schematest.Event(t, m.Data())
			ev, err := schemas.Decode(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		if got == 0 {
			return evs, batch.Error()
		}
	}
}

// streaming reports whether the agent's last stored event, read through
// url, is a streamed chunk: its turn is under way.
func streaming(t *testing.T, url, id string) bool {
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
	m, err := s.GetLastMsgForSubject(t.Context(), schemas.EventSubject(id))
	if err != nil {
		return false
	}
	schematest.Event(t, m.Data)
	return strings.Contains(string(m.Data), `"delta":true`)
}

// Each member of a cluster runs a Kaimon bus of its own on a consumer of
// its own: on one durable, shared, each bus was handed a third of the
// events, its order check passed most of them over, and an outside
// review's subscribers got 6 – 12 % of a turn each.
func TestEachClusterMemberRunsItsOwnBus(t *testing.T) {
	t.Parallel()
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	dir := t.TempDir()
	members := make([]*shoalProc, 3)
	for i := range members {
		home := filepath.Join(dir, fmt.Sprintf("s%d", i))
		members[i] = startShoal(t, home, nil, "up", "--port", "-1", "--no-node", "--mcp-listen", "127.0.0.1:0",
			"--cluster", "shoal-bus-test", "--server-name", fmt.Sprintf("s.%d", i),
			"--cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--routes", strings.Join(routes, ","),
			"--node-ttl", "10s", "--stream-max-bytes", "64MiB")
	}
	url := strings.TrimPrefix(members[0].waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	for _, m := range members {
		m.waitLineWithin("shoal: ready", 120*time.Second)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	poll.Until(t, 30*time.Second, "every member's bus consumer", func() bool {
		names = names[:0]
		for n := range stream.ConsumerNames(ctx).Name() {
			if strings.HasPrefix(n, "shoal-bus") {
				names = append(names, n)
			}
		}
		return len(names) >= 3
	})
	slices.Sort(names)
	if want := []string{"shoal-bus-s_0", "shoal-bus-s_1", "shoal-bus-s_2"}; !slices.Equal(names, want) {
		t.Errorf("the buses' consumers: %v, want one per member: %v", names, want)
	}
}
