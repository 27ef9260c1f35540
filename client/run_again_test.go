package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/netproxy"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// nodeBehindAProxy is node a on srv, running fb, and a caller whose link
// to srv goes through p, which the test cuts; the caller reconnects at
// once when the link is back.
func nodeBehindAProxy(t *testing.T, srv *broker.Broker, fb *fakebackend.Backend) (*client.Direct, *netproxy.Proxy) {
	t.Helper()
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fb}})
	p := netproxy.Start(t, srv.ClientURL())
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return f, p
}

// A run whose node answers "timed out" while the caller's connection is
// away is sent again when the caller's connection comes back; the node
// answers the copy with the reply it made, whatever it was, once the
// turn was sent: one agent_run prompts the agent once. (It kept no reply
// of a timeout, "a failure that may pass", and the copy was a new turn.)
func TestRunAnsweredTimeoutWhileAwayIsNotRunTwice(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fb := fakebackend.New(fakebackend.Config{})
	f, p := nodeBehindAProxy(t, srv, fb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// A turn of about 4 s, a run that gives it 1 s.
	text := "slow" + strings.Repeat(" word", 100)
	done := make(chan error, 1)
	go func() {
		_, err := f.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: text, Timeout: 1})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	p.Cut() // the caller's connection goes; the node's answer at 1 s is lost
	time.Sleep(2 * time.Second)
	p.Restore() // back within the caller's 30 s of margin and 90 s of loss
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(45 * time.Second):
		t.Fatal("the run never returned")
	}
	t.Logf("the run returned: %v", runErr)
	time.Sleep(8 * time.Second) // the first turn ends; a second one, if any, begins
	if n := fb.Prompts.Load(); n != 1 {
		t.Errorf("one agent_run prompted the agent %d times: the copy sent when the caller's connection came back ran the turn again", n)
	}
}

// A run whose connection is closed for good (a command's connection gives
// up reconnecting; or the caller closes it) fails at once, not after its
// whole deadline (the run's timeout + 30 s).
func TestRunFailsOnceItsConnectionIsClosed(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	op, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.Run(ctx, schemas.RunRequest{AgentID: op.AgentID, Text: "stall here", Timeout: 120})
		done <- err
	}()
	time.Sleep(time.Second)
	nc.Close()
	select {
	case err := <-done:
		t.Logf("the run returned: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("a run whose connection was closed for good still waits 20 s later (it waits out its 150 s deadline)")
	}
}

// An open whose node answers while the caller's connection is away is
// sent again when the connection comes back, and the node answers the
// copy with the reply it made: the caller learns at once that its agent
// started (it waited out a third of the open's timeout, some 43 s, before
// asking again).
func TestOpenAnsweredWhileAwayIsAskedAgainOnReturn(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fb := fakebackend.New(fakebackend.Config{StartDelay: 2 * time.Second})
	f, p := nodeBehindAProxy(t, srv, fb)
	type opened struct {
		rep schemas.OpenReply
		err error
	}
	done := make(chan opened, 1)
	go func() {
		rep, err := f.Open(t.Context(), schemas.OpenRequest{ID: "slow", CWD: t.TempDir()})
		done <- opened{rep, err}
	}()
	time.Sleep(500 * time.Millisecond)
	p.Cut() // the caller's connection goes; the node's answer at 2 s is lost
	time.Sleep(3 * time.Second)
	p.Restore()
	select {
	case got := <-done:
		if got.err != nil {
			t.Fatalf("the open across the caller's outage: %v", got.err)
		}
		if got.rep.AgentID != "slow" {
			t.Fatalf("the open answered agent %q", got.rep.AgentID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the open still waits 17 s after the caller's connection came back, its agent started meanwhile")
	}
	if n := fb.Starts.Load(); n != 1 {
		t.Errorf("one open started the agent %d times", n)
	}
}

// A request that acts, made as the caller's link goes (what it sends
// first, the read of the agent's record, lost with the link), returns
// within moments of the link's return: the read is asked again, where it
// failed after JetStream's 5 s ("read agent across: context deadline
// exceeded"), and the request after it is sent again once the link is
// back if its answer is lost too.
func TestRequestsThatActAreAskedAgainOnReturn(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fb := fakebackend.New(fakebackend.Config{})
	fabrictest.Node(t, srv, node.Config{Name: "a", Backends: []backend.Backend{fb}})
	p := netproxy.Start(t, srv.ClientURL())
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, err := client.NewDirect(nc, client.Config{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	op, err := f.Open(t.Context(), schemas.OpenRequest{ID: "across", CWD: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	id := op.AgentID
	for _, c := range []struct {
		verb string
		call func(context.Context) error
	}{
		{"send", func(ctx context.Context) error {
			_, err := f.Send(ctx, schemas.SendRequest{AgentID: id, Text: "slow" + strings.Repeat(" word", 20)})
			return err
		}},
		{"interrupt", func(ctx context.Context) error {
			_, err := f.Interrupt(ctx, schemas.AgentRequest{AgentID: id})
			return err
		}},
		{"set-model", func(ctx context.Context) error {
			_, err := f.SetModel(ctx, schemas.SetModelRequest{AgentID: id, Model: "other"})
			return err
		}},
		{"close", func(ctx context.Context) error {
			rep, err := f.Close(ctx, schemas.AgentRequest{AgentID: id})
			if err == nil && !rep.Closed {
				err = errors.New("closed false")
			}
			return err
		}},
	} {
		done := make(chan error, 1)
		p.Freeze() // the request goes into a link that holds it, and is lost with it
		go func() { done <- c.call(t.Context()) }()
		time.Sleep(300 * time.Millisecond)
		p.Cut()
		p.Thaw()
		time.Sleep(time.Second)
		p.Restore()
		back := time.Now()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s across the caller's outage: %v", c.verb, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waits 10 s after the caller's connection came back", c.verb)
		}
		t.Logf("%s answered %s after the link came back", c.verb, time.Since(back).Round(time.Millisecond))
	}
}
