package client_test

import (
	"context"
	"github.com/nats-io/nats.go/jetstream"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// A replay without follow reads to the last event stored when it began;
// retention (or a purge) can drop that event while the replay reads
// (most often when an agent's few events all age out together), and the
// replay waited for it for good: `shoal tail --no-follow`, `shoal
// events` and MCP's history hung. It ends once the stream holds nothing
// more for it.
func TestReplayEndsWhenItsLastEventsAgeOutWhileItReads(t *testing.T) {
	t.Parallel()
	const total = 3000
	f, s := deltaStream(t, "fading", total)
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Long past what a replay would wait for.
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	read := 0
	err = f.Replay(ctx, []string{"fading"}, client.From{}, false, func(client.Replayed, *client.Gap) error {
		if read++; read == 1 {
			// The last thousand go while the replay reads the first.
			for seq := info.State.LastSeq - 999; seq <= info.State.LastSeq; seq++ {
				if err := s.DeleteMsg(ctx, seq); err != nil {
					t.Errorf("delete %d: %v", seq, err)
				}
			}
		}
		return nil
	})
	if ctx.Err() != nil {
		t.Fatalf("the replay read %d events and then waited until its caller gave up (err %v): it waits for events the stream no longer holds", read, err)
	}
	if err != nil || read < total-1000 {
		t.Fatalf("the replay read %d events of the %d kept: %v", read, total-1000, err)
	}
}

// A replay of what is stored whose consumer the server drops while it
// reads (a reader paused past the consumer's inactive threshold: `shoal
// events | less`; a server restart) goes on from the message after the
// last it delivered: it failed after the first batch ("consumer not
// found", or no heartbeat), found by an outside review.
func TestReplayGoesOnWhenItsConsumerIsDropped(t *testing.T) {
	t.Parallel()
	const total = 2000
	f, s := deltaStream(t, "paged", total)
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	var read []uint64
	err := f.Replay(ctx, []string{"paged"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		if read = append(read, r.N); len(read) == 1 {
			// The server drops the replay's consumer, as it does one
			// left idle past its inactive threshold.
			names := s.ConsumerNames(ctx)
			for name := range names.Name() {
				if err := s.DeleteConsumer(ctx, name); err != nil {
					t.Errorf("delete consumer %s: %v", name, err)
				}
			}
		}
		return nil
	})
	if err != nil || ctx.Err() != nil || len(read) != total || read[0] != 1 || read[total-1] != total {
		t.Fatalf("the replay whose consumer was dropped read %d of %d events (first %v): %v (deadline: %v)", len(read), total, read[:min(1, len(read))], err, ctx.Err())
	}
	for i, n := range read {
		if n != uint64(i+1) {
			t.Fatalf("event %d read as %d: the replay skipped or repeated events", i+1, n)
		}
	}
}

// deltaStream is a fabric whose stream holds agent id's events 1..n,
// each a text delta, and the stream.
func deltaStream(t *testing.T, id string, n uint64) (*client.Direct, jetstream.Stream) {
	t.Helper()
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: id}
	for a.n < n {
		a.emit(1, schemas.AssistantText{Delta: true, Content: schemas.Text("x")})
	}
	s, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return f, s
}
