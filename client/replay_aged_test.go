package client_test

import (
	"context"
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
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "fading"}
	const total = 3000
	for a.n < total {
		a.emit(1, schemas.AssistantText{Delta: true, Content: schemas.Text("x")})
	}
	s, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
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
