package bridge_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A client with scoped credentials drives the fabric through the
// coordinator alone: every verb, a page of events and a followed replay.
func TestClientDrivesThroughTheCoordinator(t *testing.T) {
	t.Parallel()
	s := startSecured(t)
	s.startNode(t, "n1")
	f, err := bridge.NewFabric(s.connect(t, broker.RoleClient, "cli"), bridge.FabricConfig{ViaCoordinator: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 60*time.Second)
	nodes, err := f.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "n1" {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	open, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil || open.Node != "n1" {
		t.Fatalf("open: %+v %v", open, err)
	}
	id := open.AgentID

	// A followed replay sees the turn as it happens.
	seen := make(chan bridge.Replayed, 64)
	rctx, stopReplay := context.WithCancel(ctx)
	replayed := make(chan error, 1)
	go func() {
		replayed <- f.Replay(rctx, []string{id}, bridge.From{}, true, func(r bridge.Replayed, gap *bridge.Gap) error {
			if gap != nil {
				return gap
			}
			seen <- r
			return nil
		})
	}()

	if run, err := f.Run(ctx, schemas.RunRequest{AgentID: id, Text: "hello"}); err != nil || run.Text != "echo: hello" {
		t.Fatalf("run: %+v %v", run, err)
	}
	if sent, err := f.Send(ctx, schemas.SendRequest{AgentID: id, Text: "more"}); err != nil || sent.Turn != 2 {
		t.Fatalf("send: %+v %v", sent, err)
	}
	var n uint64
	for results := 0; results < 2; {
		select {
		case r := <-seen:
			if r.N != n+1 || r.Agent != id || r.Node != "n1" || r.Time.IsZero() {
				t.Fatalf("replayed event %+v after %d", r, n)
			}
			n = r.N
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
	rec, err := f.Status(ctx, id)
	if err != nil || rec.Turn != 2 || rec.Node != "n1" {
		t.Fatalf("status: %+v %v", rec, err)
	}
	page, err := f.Events(ctx, schemas.EventsRequest{AgentID: id, FromTurn: 2})
	if err != nil || len(page.Events) == 0 || page.Events[0].N <= 1 {
		t.Fatalf("events: %+v %v", page, err)
	}
	list, err := f.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := f.Status(ctx, "nobody"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("status of an unknown agent: %v", err)
	}
	if c, err := f.Close(ctx, id); err != nil || !c.Closed {
		t.Fatalf("close: %+v %v", c, err)
	}
	// Without follow, the replay ends where the stream does.
	var last bridge.Replayed
	if err := f.Replay(ctx, []string{id}, bridge.From{Turn: 2}, false, func(r bridge.Replayed, _ *bridge.Gap) error {
		last = r
		return nil
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
	s := startSecured(t)
	s.startNode(t, "n1")
	ctx := natstest.Context(t, 60*time.Second)
	open, err := s.f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.f.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	nc := s.connect(t, broker.RoleObserver, "eyes")
	f, err := bridge.NewFabric(nc, bridge.FabricConfig{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var events int
	if err := f.Replay(ctx, nil, bridge.From{}, false, func(bridge.Replayed, *bridge.Gap) error { events++; return nil }); err != nil || events < 6 {
		t.Fatalf("observer replay: %d events, %v", events, err)
	}
	if out, err := f.Output(ctx, schemas.OutputRequest{AgentID: open.AgentID}); err != nil || out.Text != "echo: hi" {
		t.Fatalf("observer output: %+v %v", out, err)
	}
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
	if _, err := nc.Request(bridge.FabricSubject("send"), []byte(`{"agent_id":"`+open.AgentID+`","text":"x"}`), 2*time.Second); err == nil {
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
	rec, _, err := s.f.Record(ctx, open.AgentID)
	if err != nil || rec.Turn != 1 {
		t.Fatalf("the agent after the observer's attempts: %+v %v", rec, err)
	}
}
