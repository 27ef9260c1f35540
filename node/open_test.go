package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent that does not start within the node's open timeout (an ACP
// handshake that never answers): the open says so, and nothing is left
// of it, no record and nothing on the stream; the id can be opened again.
func TestAnOpenThatNeverStartsLeavesNothing(t *testing.T) {
	t.Parallel()
	f := neverStarting(t, 300*time.Millisecond)
	ctx := natstest.Context(t, 30*time.Second)
	_, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "stuck"})
	if schemas.CodeOf(err) != schemas.CodeTimeout || !strings.Contains(err.Error(), "agent stuck did not start within 300ms") {
		t.Fatalf("the open: %v (%s)", err, schemas.CodeOf(err))
	}
	if rec, err := f.Record(ctx, "stuck"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("the failed open left a record: %+v %v", rec, err)
	}
	if list, err := f.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("agent_list after the failed open: %+v %v", list, err)
	}
	var kinds []string
	err = f.Replay(ctx, []string{"stuck"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		ev, err := r.Event()
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, string(ev.Kind()))
		return nil
	})
	if len(kinds) != 0 {
		t.Fatalf("the stream holds %v (%v)", kinds, err)
	}
	// The id is free again: a second open is claimed and fails the same way.
	if _, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "stuck"}); schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Fatalf("opening the id again: %v", err)
	}
}

// A turn sent to an agent still starting (its open stretched by an outage
// of the coordinator, its caller gone) crashed the whole node: the agent
// is the node's from its reservation, and the turn was given to a backend
// session not made yet. It is refused, saying the agent is still
// starting, and the node goes on: the open ends as it would have.
func TestATurnForAnAgentStillStartingIsRefused(t *testing.T) {
	t.Parallel()
	// Long enough for the turns below on a loaded machine.
	f := neverStarting(t, 15*time.Second)
	ctx := natstest.Context(t, time.Minute)
	opened := make(chan error, 1)
	go func() {
		_, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "early"})
		opened <- err
	}()
	poll.Until(t, 10*time.Second, "the agent starting", func() bool {
		rec, err := f.Record(ctx, "early")
		return err == nil && rec.Status == schemas.StatusStarting && rec.EventLog != ""
	})
	for _, send := range []func() error{
		func() error {
			_, err := f.Send(ctx, schemas.SendRequest{AgentID: "early", Text: "too soon"})
			return err
		},
		func() error { _, err := f.Run(ctx, schemas.RunRequest{AgentID: "early", Text: "too soon"}); return err },
	} {
		if err := send(); schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "still starting") {
			t.Errorf("a turn for an agent still starting: %v (%s), want unavailable, still starting", err, schemas.CodeOf(err))
		}
	}
	if err := <-opened; schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Fatalf("the open: %v, want its timeout", err)
	}
	// The node lives on: it answers.
	if _, err := f.Nodes(ctx); err != nil {
		t.Fatalf("the node after the refused turns: %v", err)
	}
}

// A close of an agent still starting (its caller gone, say) answered
// closed at once, while the agent went on starting until the open's
// timeout, its record saying starting and its id in use. The close now
// cancels the start: once it answers, the open has ended, the record no
// longer says starting, and the open's caller is told it was closed.
func TestACloseOfAnAgentStillStartingEndsIt(t *testing.T) {
	t.Parallel()
	f := neverStarting(t, time.Minute)
	ctx := natstest.Context(t, 2*time.Minute)
	opened := make(chan error, 1)
	go func() {
		_, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "early"})
		opened <- err
	}()
	poll.Until(t, 10*time.Second, "the agent starting", func() bool {
		rec, err := f.Record(ctx, "early")
		return err == nil && rec.Status == schemas.StatusStarting && rec.EventLog != ""
	})
	if rep, err := f.Close(ctx, schemas.AgentRequest{AgentID: "early"}); err != nil || !rep.Closed {
		t.Fatalf("closing an agent still starting: %+v %v", rep, err)
	}
	if rec, err := f.Record(ctx, "early"); err == nil && rec.Status != schemas.StatusDead {
		t.Errorf("once the close answered, the agent's record says %s", rec.Status)
	}
	select {
	case err := <-opened:
		if err == nil || !strings.Contains(err.Error(), "was closed as it started") {
			t.Errorf("the open of an agent closed as it started: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the open still waits 30 s after its agent was closed")
	}
}

// neverStarting starts node "slow", whose agents never finish starting
// (their backend's start waits for its context), within an open timeout
// of openTimeout, and returns a client of its fabric.
func neverStarting(t *testing.T, openTimeout time.Duration) *client.Direct {
	t.Helper()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "slow", OpenTimeout: openTimeout,
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{StartHang: true})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}
