package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// A client with scoped credentials drives the fabric through the
// coordinator alone: every verb, a page of events and a followed replay.
func TestClientDrivesThroughTheCoordinator(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "n1")
	f, err := client.New(s.Connect(t, broker.RoleClient, "cli"), client.Config{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 60*time.Second)
	nodes, err := f.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "n1" {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	schematest.ControlValue(t, "nodes_reply", schemas.NodesReply{Nodes: nodes})
	open, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil || open.Node != "n1" {
		t.Fatalf("open: %+v %v", open, err)
	}
	schematest.ControlValue(t, "open_reply", open)
	id := open.AgentID

	// A followed replay sees the turn as it happens.
	seen := make(chan client.Replayed, 64)
	rctx, stopReplay := context.WithCancel(ctx)
	replayed := make(chan error, 1)
	go func() {
		replayed <- f.Replay(rctx, []string{id}, client.From{}, true, func(r client.Replayed, gap *client.Gap) error {
			if gap != nil {
				return gap
			}
			seen <- r
			return nil
		})
	}()

	run, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: "hello"})
	if err != nil || run.Text != "echo: hello" {
		t.Fatalf("run: %+v %v", run, err)
	}
	schematest.ControlValue(t, "run_reply", run)
	sent, err := f.Send(ctx, schemas.SendRequest{AgentID: id, Text: "more"})
	if err != nil || sent.Turn != 2 {
		t.Fatalf("send: %+v %v", sent, err)
	}
	schematest.ControlValue(t, "send_reply", sent)
	var n uint64
	for results := 0; results < 2; {
		select {
		case r := <-seen:
			if r.N != n+1 || r.Agent != id || r.Node != "n1" || r.Time.IsZero() {
				t.Fatalf("replayed event %+v after %d", r, n)
			}
			n = r.N
			schematest.Event(t, r.Raw)
			if r.Kind == schemas.KindResult {
				results++
			}
		case err := <-replayed:
			t.Fatalf("the replay ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("the replay stopped at event %d", n)
		}
	}
	stopReplay()
	if err := <-replayed; err != nil {
		t.Fatalf("replay: %v", err)
	}

	out, err := f.Output(ctx, schemas.OutputRequest{AgentID: id})
	if err != nil || out.Text != "echo: more" {
		t.Fatalf("output: %+v %v", out, err)
	}
	schematest.ControlValue(t, "output_reply", out)
	rec, err := f.Status(ctx, id)
	if err != nil || rec.Turn != 2 || rec.Node != "n1" {
		t.Fatalf("status: %+v %v", rec, err)
	}
	schematest.ControlValue(t, "agent_record", rec)
	page, err := f.Events(ctx, schemas.EventsRequest{AgentID: id, FromTurn: 2})
	if err != nil || len(page.Events) == 0 || page.Events[0].N <= 1 {
		t.Fatalf("events: %+v %v", page, err)
	}
	schematest.ControlValue(t, "events_reply", page)
	for _, e := range page.Events {
		schematest.Event(t, e.Event)
	}
	list, err := f.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list: %+v %v", list, err)
	}
	schematest.ControlValue(t, "list_reply", schemas.ListReply{Agents: list})
	if _, err := f.Status(ctx, "nobody"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("status of an unknown agent: %v", err)
	}
	c, err := f.Close(ctx, schemas.AgentRequest{AgentID: id})
	if err != nil || !c.Closed {
		t.Fatalf("close: %+v %v", c, err)
	}
	schematest.ControlValue(t, "close_reply", c)
	// Without follow, the replay ends where the stream does.
	var last client.Replayed
	if err := f.Replay(ctx, []string{id}, client.From{Turn: 2}, false, func(r client.Replayed, _ *client.Gap) error {
		last = r
		return schematest.ValidateEvent(r.Raw)
	}); err != nil {
		t.Fatal(err)
	}
	if ev, err := last.Event(); err != nil || ev.Payload.Kind() != schemas.KindStatus {
		t.Fatalf("the replay ended with %+v %v", ev, err)
	}
}

// An observer watches and replays, and is refused everything that drives
// an agent: by its own client before a request leaves, and by the server
// when a request is made anyway.
func TestObserverReplaysButCannotDrive(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "n1")
	ctx := natstest.Context(t, 60*time.Second)
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.F.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	nc := s.Connect(t, broker.RoleObserver, "eyes")
	f, err := client.New(nc, client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var events int
	if err := f.Replay(ctx, nil, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		events++
		return schematest.ValidateEvent(r.Raw)
	}); err != nil || events < 6 {
		t.Fatalf("observer replay: %d events, %v", events, err)
	}
	out, err := f.Output(ctx, schemas.OutputRequest{AgentID: open.AgentID})
	if err != nil || out.Text != "echo: hi" {
		t.Fatalf("observer output: %+v %v", out, err)
	}
	schematest.ControlValue(t, "output_reply", out)
	_, err = f.Send(ctx, schemas.SendRequest{AgentID: open.AgentID, Text: "do something"})
	if err == nil || !strings.Contains(err.Error(), "may only observe") {
		t.Fatalf("observer send: %v", err)
	}
	if _, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()}); err == nil {
		t.Fatal("an observer opened an agent")
	}
	// Made by hand, the request is refused by the server.
	violations := make(chan error, 4)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
	if _, err := nc.Request(schemas.FabricSubject("send"), []byte(`{"agent_id":"`+open.AgentID+`","text":"x"}`), 2*time.Second); err == nil {
		t.Fatal("an observer's send request was answered")
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "shoal.fabric.send") {
			t.Fatalf("violation: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no permissions violation was reported")
	}
	rec, err := s.F.Record(ctx, open.AgentID)
	if err != nil || rec.Turn != 1 {
		t.Fatalf("the agent after the observer's attempts: %+v %v", rec, err)
	}
}

// A node whose heartbeat expires is lost: the coordinator's monitor marks
// its agents dead and closes their streams with an error naming the node,
// a cancelled result for a turn left open, and status dead. The events
// and records it writes fit the JSON Schema.
func TestNodeLossEventsFitTheSchema(t *testing.T) {
	t.Parallel()
	b, nc, js, ctx, nodes, agents := nodeLossFabric(t)
	// Node n1 runs two agents: one in the middle of turn 1, one idle
	// after it.
	busy := &agentStream{t: t, js: js, id: "busy"}
	busy.emit(0, schemas.Status{Status: schemas.StatusIdle})
	busy.emit(0, schemas.UserText{Content: schemas.Text("go on")})
	busy.emit(1, schemas.Status{Status: schemas.StatusWorking})
	busy.emit(1, schemas.TurnStarted{})
	busy.emit(1, schemas.AssistantText{Delta: true, Content: schemas.Text("wor")})
	calm := &agentStream{t: t, js: js, id: "calm"}
	calm.emit(0, schemas.Status{Status: schemas.StatusIdle})
	calm.turn(1, "done")
	for _, rec := range []schemas.AgentRecord{
		{ID: "busy", Status: schemas.StatusWorking, Turn: 1, Node: "n1"},
		{ID: "calm", Status: schemas.StatusIdle, Turn: 1, Node: "n1"},
	} {
		raw, _ := json.Marshal(rec)
		if _, err := agents.Put(ctx, rec.ID, raw); err != nil {
			t.Fatal(err)
		}
	}
	beat, _ := json.Marshal(schemas.NodeRecord{Name: "n1"})
	if _, err := nodes.Put(ctx, "n1", beat); err != nil {
		t.Fatal(err)
	}

	fabrictest.Monitor(t, natstest.Connect(t, b), 100*time.Millisecond)

	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	closing := func(id string, from uint64) []client.Replayed {
		t.Helper()
		for {
			e, err := agents.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			schematest.Control(t, "agent_record", e.Value())
			var rec schemas.AgentRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				t.Fatal(err)
			}
			var c collected
			if err := f.Replay(ctx, []string{id}, client.From{Event: from}, false, c.fn); err != nil {
				t.Fatal(err)
			}
			c.check(t)
			if n := len(c.evs); rec.Status == schemas.StatusDead && n > 0 && c.evs[n-1].Kind == schemas.KindStatus {
				return c.evs
			}
			select {
			case <-ctx.Done():
				t.Fatalf("agent %s was never closed (record %s, %d closing events)", id, rec.Status, len(c.evs))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	for _, c := range []struct {
		a    *agentStream
		want string
	}{
		{busy, "error@1 result@1 status@1"},
		{calm, "error@1 status@1"},
	} {
		evs := closing(c.a.id, c.a.n+1)
		var kinds []string
		for i, r := range evs {
			if r.N != c.a.n+1+uint64(i) || r.Node != "coordinator" {
				t.Errorf("%s: closing event %d is number %d from %q", c.a.id, i, r.N, r.Node)
			}
			ev, err := r.Event()
			if err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, fmt.Sprintf("%s@%d", ev.Kind(), ev.Turn))
			switch p := ev.Payload.(type) {
			case schemas.Error:
				if !strings.Contains(p.Message, "node n1 was lost") {
					t.Errorf("%s: the error says %q", c.a.id, p.Message)
				}
			case schemas.Result:
				if p.StopReason != schemas.StopCancelled {
					t.Errorf("%s: the open turn ended %s", c.a.id, p.StopReason)
				}
			case schemas.Status:
				if p.Status != schemas.StatusDead {
					t.Errorf("%s: the stream ends with status %s", c.a.id, p.Status)
				}
			}
		}
		if got := strings.Join(kinds, " "); got != c.want {
			t.Errorf("%s: the coordinator closed the stream with %s, want %s", c.a.id, got, c.want)
		}
	}
}
