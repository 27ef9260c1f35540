package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// securedFabric is a broker with authentication on, the coordinator's
// relay, and a fabric client with the coordinator's rights.
type securedFabric struct {
	b    *broker.Broker
	auth *broker.Authority
	f    *bridge.Fabric
}

func startSecured(t testing.TB, mutate ...func(*broker.Config)) *securedFabric {
	t.Helper()
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	b := natstest.Start(t, append([]func(*broker.Config){func(c *broker.Config) { c.Auth = auth }}, mutate...)...)
	coord, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := bridge.NewRelay(ctx, bridge.RelayConfig{Conn: coord})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	f, err := bridge.NewFabric(coord, bridge.FabricConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WatchNodes(ctx); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- bridge.Serve(ctx, coord, f, "0.0.0-test") }()
	t.Cleanup(func() { cancel(); <-done; <-served })
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := coord.Request(bridge.FabricSubject("nodes"), []byte(`{}`), time.Second)
		select {
		case err := <-served:
			served <- err // for the cleanup
			t.Fatalf("the fabric service: %v", err)
		default:
		}
		if err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the fabric service never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &securedFabric{b: b, auth: auth, f: f}
}

// creds issues credentials and returns the file's path.
func (s *securedFabric) creds(t testing.TB, role broker.Role, name string) string {
	t.Helper()
	b, err := s.auth.Issue(role, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// connect issues credentials and connects with them.
func (s *securedFabric) connect(t testing.TB, role broker.Role, name string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append(opts, nats.UserCredentials(s.creds(t, role, name)), nats.CustomInboxPrefix(schemas.InboxPrefix(string(role), name)))
	return natstest.Connect(t, s.b, opts...)
}

// startNode runs a confined node with the echo backend.
func (s *securedFabric) startNode(t *testing.T, name string) {
	t.Helper()
	s.runNode(t, name, s.connect(t, broker.RoleNode, name))
}

// runNode runs a confined node on nc, with the echo backend unless bs
// are given.
func (s *securedFabric) runNode(t testing.TB, name string, nc *nats.Conn, bs ...backend.Backend) {
	t.Helper()
	if len(bs) == 0 {
		bs = []backend.Backend{fakebackend.New(fakebackend.Config{})}
	}
	h, err := node.New(node.Config{Name: name, Conn: nc, Dir: t.TempDir(), Backends: bs, Relay: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-h.Ready():
	case err := <-done:
		t.Fatalf("node %s: %v", name, err)
	}
	// Placement knows the node once the coordinator's view has its entry.
	wait := natstest.Context(t, 10*time.Second)
	for {
		nodes, _ := s.f.Nodes(wait)
		if slices.ContainsFunc(nodes, func(n schemas.NodeRecord) bool { return n.Name == name }) {
			return
		}
		select {
		case <-wait.Done():
			t.Fatalf("node %s never appeared in the coordinator's view", name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A node with scoped credentials runs agents like any other: its events
// reach agent.<id> through the relay, its records and heartbeat reach the
// buckets, and a restart of the agent's life continues its numbering.
func TestConfinedNodeRunsAgents(t *testing.T) {
	t.Parallel()
	s := startSecured(t)
	s.startNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	nodes, err := s.f.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	schematest.ControlValue(t, "nodes_reply", schemas.NodesReply{Nodes: nodes})
	open, err := s.f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"})
	if err != nil || open.Node != "a" {
		t.Fatalf("open: %+v %v", open, err)
	}
	schematest.ControlValue(t, "open_reply", open)
	run, err := s.f.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "hi"})
	if err != nil || run.Text != "echo: hi" {
		t.Fatalf("run: %+v %v", run, err)
	}
	schematest.ControlValue(t, "run_reply", run)
	if _, err := s.f.Close(ctx, "pal"); err != nil {
		t.Fatal(err)
	}
	// Reopened, the agent's numbering continues where its stream stopped.
	if _, err := s.f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if run, err := s.f.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "again"}); err != nil || run.Text != "echo: again" {
		t.Fatalf("second life: %+v %v", run, err)
	}
	rec, err := s.f.Status(ctx, "pal")
	if err != nil || rec.Node != "a" || rec.Status != schemas.StatusIdle {
		t.Fatalf("record %+v %v", rec, err)
	}
	schematest.ControlValue(t, "agent_record", rec)
	// The stream holds both lives, numbered on from one to the other.
	var kinds []string
	var want uint64 = 1
	results := 0
	errEnough := errors.New("enough")
	err = s.f.Replay(ctx, []string{"pal"}, bridge.From{}, true, func(r bridge.Replayed, gap *bridge.Gap) error {
		if gap != nil || r.N != want || r.Node != "a" {
			t.Fatalf("event %d from %s (gap %v), want event %d from a", r.N, r.Node, gap, want)
		}
		want++
		schematest.Event(t, r.Raw)
		kinds = append(kinds, string(r.Kind))
		if r.Kind == schemas.KindResult {
			if results++; results == 2 {
				return errEnough
			}
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("replay: %v after %s", err, strings.Join(kinds, " "))
	}
	if got := strings.Join(kinds, " "); strings.Count(got, "status") < 6 {
		t.Fatalf("stream: %s", got)
	}
}

// The relay refuses what a node does not own, a header a node may not set,
// and anything whose reply is not the node's own inbox.
func TestRelayRefusesWhatANodeDoesNotOwn(t *testing.T) {
	t.Parallel()
	s := startSecured(t)
	s.startNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	if _, err := s.f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "theirs", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	mallory := s.connect(t, broker.RoleNode, "mallory")
	js, err := jetstream.New(mallory)
	if err != nil {
		t.Fatal(err)
	}
	event := func(agent, msgID string, extra ...string) *nats.Msg {
		m := nats.NewMsg(schemas.RelaySubject("mallory", schemas.RelayEvent, agent))
		m.Data = []byte(`{"kind":"error","turn":1,"data":{"message":"forged","data":null}}`)
		m.Header.Set(schemas.HeaderMsgID, msgID)
		m.Header.Set(schemas.HeaderNode, "mallory")
		for i := 0; i+1 < len(extra); i += 2 {
			m.Header.Set(extra[i], extra[i+1])
		}
		return m
	}
	refusedWith := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Fatalf("%s: got %v, want a refusal about %q", what, err, want)
		}
	}
	_, err = js.PublishMsg(ctx, event("theirs", "theirs.99"))
	refusedWith("an event of node a's agent", err, "does not own agent theirs")

	// A record of mallory's own, claimed through the relay, makes an agent
	// mallory owns.
	put := func(id string, rec schemas.AgentRecord, rev string, extra ...string) error {
		m := nats.NewMsg(schemas.RelaySubject("mallory", schemas.RelayRecord, id))
		m.Data, _ = json.Marshal(rec)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, rev)
		for i := 0; i+1 < len(extra); i += 2 {
			m.Header.Set(extra[i], extra[i+1])
		}
		_, err := js.PublishMsg(ctx, m)
		return err
	}
	if err := put("mine", schemas.AgentRecord{ID: "mine", Node: "mallory", Status: schemas.StatusIdle}, "0"); err != nil {
		t.Fatalf("mallory's own record: %v", err)
	}
	_, rev, err := s.f.Record(ctx, "theirs")
	if err != nil {
		t.Fatal(err)
	}
	refusedWith("taking over a live agent's record", put("theirs", schemas.AgentRecord{ID: "theirs", Node: "mallory"}, strconv.FormatUint(rev, 10)), "belongs to node a")
	refusedWith("a record naming another node", put("other", schemas.AgentRecord{ID: "other", Node: "a"}, "0"), "on node a")
	refusedWith("a record write without compare-and-set", func() error {
		m := nats.NewMsg(schemas.RelaySubject("mallory", schemas.RelayRecord, "mine"))
		m.Data, _ = json.Marshal(schemas.AgentRecord{ID: "mine", Node: "mallory"})
		_, err := js.PublishMsg(ctx, m)
		return err
	}(), "must say the revision")
	refusedWith("a rollup header", put("mine", schemas.AgentRecord{ID: "mine", Node: "mallory"}, "1", "Nats-Rollup", "all"), "Nats-Rollup")

	_, err = js.PublishMsg(ctx, event("mine", "theirs.1"))
	refusedWith("an event numbered as another agent's", err, "not an event of agent mine")
	_, err = js.PublishMsg(ctx, event("mine", "mine.1", "Nats-Expected-Stream", "KV_shoal_agents"))
	refusedWith("an event with a JetStream header", err, "Nats-Expected-Stream")

	beat := nats.NewMsg(schemas.RelaySubject("mallory", schemas.RelayBeat))
	beat.Data, _ = json.Marshal(schemas.NodeRecord{Name: "a"})
	_, err = js.PublishMsg(ctx, beat)
	refusedWith("a heartbeat in node a's name", err, "node record of mallory")

	// A message whose reply is not mallory's inbox is dropped unanswered;
	// the relay handles events in order, so once the next one is stored
	// the forged one has been seen.
	forged := event("mine", "mine.1")
	forged.Reply = "$KV.shoal_agents.theirs"
	if err := mallory.PublishMsg(forged); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, event("mine", "mine.2")); err != nil {
		t.Fatalf("mallory's own event: %v", err)
	}
	stream, _ := s.f.JetStream().Stream(ctx, schemas.StreamName)
	stored, err := stream.GetLastMsgForSubject(ctx, schemas.EventSubject("mine"))
	if err != nil {
		t.Fatal(err)
	}
	schematest.Event(t, stored.Data)
	info, _ := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.EventSubject("mine")))
	if n := info.State.Subjects[schemas.EventSubject("mine")]; n != 1 {
		t.Fatalf("agent mine has %d stored events, want only the legitimate one", n)
	}
	rec, _, err := s.f.Record(ctx, "theirs")
	if err != nil || rec.Node != "a" {
		t.Fatalf("node a's record after the attempts: %+v %v", rec, err)
	}
}
