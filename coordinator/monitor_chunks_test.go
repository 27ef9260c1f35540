package coordinator_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A sender killed mid-send left its bundle's chunks in the repositories'
// store, named by no object, for the store's 24 hours: they counted
// against its bound, and the retry of that very send was refused for
// want of room. The monitor removes chunks no object names once no new
// one has come for a while; an object's chunks, and a put still going
// on, are left.
func TestMonitorRemovesTheChunksOfASenderKilledMidSend(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	ctx := t.Context()
	obs, err := js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	whole := bytes.Repeat([]byte("w"), 300<<10)
	if _, err := obs.PutBytes(ctx, "r1/whole.bundle", whole); err != nil {
		t.Fatal(err)
	}
	const prefix = "$O." + schemas.ReposBucket + ".C."
	for range 3 {
		if _, err := js.Publish(ctx, prefix+"KILLEDMIDSEND", bytes.Repeat([]byte("k"), 128<<10)); err != nil {
			t.Fatal(err)
		}
	}
	// A put going on: a chunk every 200 ms.
	going := make(chan struct{})
	go func() {
		defer close(going)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
				js.Publish(ctx, prefix+"STILLSENDING", []byte("s"))
			}
		}
	}()
	t.Cleanup(func() { <-going })

	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Grace: time.Minute, ChunksIdle: 2 * time.Second, ChunksEvery: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	stream, err := js.Stream(ctx, "OBJ_"+schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() map[string]uint64 {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects
	}
	poll.Until(t, 30*time.Second, "the chunks of the killed send to go", func() bool { return subjects()[prefix+"KILLEDMIDSEND"] == 0 })
	time.Sleep(time.Second) // a few more rounds
	if got := subjects(); got[prefix+"STILLSENDING"] == 0 {
		t.Errorf("the chunks of a put going on were removed: %v", got)
	}
	if got, err := obs.GetBytes(ctx, "r1/whole.bundle"); err != nil || !bytes.Equal(got, whole) {
		t.Errorf("the whole object after the sweep: %d bytes, %v", len(got), err)
	}
}
