package coordinator_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node with scoped credentials runs agents like any other: its events
// reach agent.<id> through the relay, its records and heartbeat reach the
// buckets, and a restart of the agent's life continues its numbering.
func TestConfinedNodeRunsAgents(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	nodes, err := s.F.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	schematest.ControlValue(t, "nodes_reply", schemas.NodesReply{Nodes: nodes})
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"})
	if err != nil || open.Node != "a" {
		t.Fatalf("open: %+v %v", open, err)
	}
	schematest.ControlValue(t, "open_reply", open)
	run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "hi"})
	if err != nil || run.Text != "echo: hi" {
		t.Fatalf("run: %+v %v", run, err)
	}
	schematest.ControlValue(t, "run_reply", run)
	if _, err := s.F.Close(ctx, schemas.AgentRequest{AgentID: "pal"}); err != nil {
		t.Fatal(err)
	}
	// Reopened, the agent's numbering continues where its stream stopped.
	if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "again"}); err != nil || run.Text != "echo: again" {
		t.Fatalf("second life: %+v %v", run, err)
	}
	rec, err := s.F.Status(ctx, "pal")
	if err != nil || rec.Node != "a" || rec.Status != schemas.StatusIdle {
		t.Fatalf("record %+v %v", rec, err)
	}
	schematest.ControlValue(t, "agent_record", rec)
	// The stream holds both lives, numbered on from one to the other.
	var kinds []string
	var want uint64 = 1
	results := 0
	errEnough := errors.New("enough")
	err = s.F.Replay(ctx, []string{"pal"}, client.From{}, true, func(r client.Replayed, gap *client.Gap) error {
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
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "theirs", Node: "a"}); err != nil {
		t.Fatal(err)
	}
	mallory := s.Connect(t, broker.RoleNode, "mallory")
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
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "theirs")
	if err != nil {
		t.Fatal(err)
	}
	rev := e.Revision()
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
	stream, _ := s.F.JetStream().Stream(ctx, schemas.StreamName)
	stored, err := stream.GetLastMsgForSubject(ctx, schemas.EventSubject("mine"))
	if err != nil {
		t.Fatal(err)
	}
	schematest.Event(t, stored.Data)
	info, _ := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.EventSubject("mine")))
	if n := info.State.Subjects[schemas.EventSubject("mine")]; n != 1 {
		t.Fatalf("agent mine has %d stored events, want only the legitimate one", n)
	}
	rec, err := s.F.Record(ctx, "theirs")
	if err != nil || rec.Node != "a" {
		t.Fatalf("node a's record after the attempts: %+v %v", rec, err)
	}
}
