package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A following replay that ends removes its consumer from the stream: an
// outside review's dashboard tabs, dropped mid-stream, each left one the
// server kept for five minutes, and a thousand of them (the stream's
// room) made every replay fail with "maximum consumers limit reached".
func TestAFollowThatEndsLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, time.Minute)
	agents, err := js.KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, CWD: "/tmp", CreatedAt: float64(time.Now().Unix()), EventLog: "a1.jsonl"})
	if _, err := agents.Put(ctx, "a1", rec); err != nil {
		t.Fatal(err)
	}
	data, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hello")}})
	if _, err := js.Publish(ctx, schemas.EventSubject("a1"), data); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	before := consumers()
	stopped := errors.New("seen")
	for range 20 {
		err := f.Replay(ctx, []string{"a1"}, client.From{}, true, func(client.Replayed, *client.Gap) error { return stopped })
		if !errors.Is(err, stopped) {
			t.Fatalf("a follow: %v", err)
		}
	}
	// A follow ended by its context, as a dropped reader's is.
	for range 5 {
		c, cancel := context.WithCancel(ctx)
		seen := make(chan struct{})
		go func() {
			<-seen
			cancel()
		}()
		f.Replay(c, []string{"a1"}, client.From{}, true, func(client.Replayed, *client.Gap) error {
			select {
			case <-seen:
			default:
				close(seen)
			}
			return nil
		})
	}
	poll.Until(t, 5*time.Second, "the follows' consumers to be gone", func() bool { return consumers() <= before })
}
