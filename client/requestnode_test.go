package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A request to a node that answers nothing ends as soon as the caller's
// connection closes, saying so, not at its deadline: its reply waits on a
// channel of its own, which a closed connection does not close, as it
// closes a sync subscription's.
func TestRequestNodeEndsWhenTheConnectionCloses(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	silent := natstest.Connect(t, b)
	asked := make(chan struct{}, 1)
	if _, err := silent.Subscribe(schemas.ControlSubject("n1", schemas.VerbSend), func(*nats.Msg) { asked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, b)
	ended := make(chan error, 1)
	go func() {
		_, err := client.RequestNode(natstest.Context(t, time.Minute), nc, "n1", schemas.ControlSubject("n1", schemas.VerbSend), []byte(`{}`))
		ended <- err
	}()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the node was not asked within 10 s")
	}
	nc.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("the request ended with %v, want %v", err, nats.ErrConnectionClosed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request still waited 10 s after its connection closed")
	}
}
