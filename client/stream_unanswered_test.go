package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A read of where an agent's stream ends whose request or answer is lost
// (with a connection cut as it went, as the relay's can be) gets no
// answer at all. A caller that set no deadline, as the relay deciding a
// node's event, waited for ever: the node's lane at the relay stood
// still, and a confined node stored nothing more of its agents (a
// relay cut every 30 ms left one in CI at event 522 of 20,000). Here the
// stream's direct reads go to a subscriber that never answers.
func TestStreamTailOfAnUnansweredReadEnds(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, time.Minute)
	st, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	a := &agentStream{t: t, js: js, id: "quiet"}
	a.turn(1, "hello")
	if _, err := nc.Subscribe("$JS.API.DIRECT.GET."+schemas.StreamName, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	st, err = js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := client.StreamTail(context.Background(), nc, st, "quiet")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a read of the stream's end whose direct read was never answered succeeded")
		}
		if schemas.CodeOf(err) != schemas.CodeUnavailable {
			t.Errorf("an unanswered read: %v (code %s), want unavailable", err, schemas.CodeOf(err))
		}
		t.Logf("as it should: %v", err)
	case <-time.After(45 * time.Second):
		t.Fatal("a read of the stream's end with no deadline of its caller's, whose direct read was never answered, still waits after 45 s: whoever asked (the relay deciding a node's event) is held with it")
	}
}
