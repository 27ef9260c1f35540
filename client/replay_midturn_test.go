package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Retention dropped the beginning of turn 2 (its echo, working status
// and turn_started) and kept the rest of it, and no later turn is
// stored: a replay from turn 2 says the turn is past the stream's
// retention, as shoal output --turn 2 does. An outside review's returned
// nothing and no error, and a following one waited in silence for ever.
func TestReplayFromATurnWhoseStartAgedOutSaysSo(t *testing.T) {
	f, js := streamFabric(t)
	a := &agentStream{t: t, js: js, id: "midturn"}
	a.emit(0, schemas.Status{Status: schemas.StatusIdle}) // 1
	a.turn(1, "first")                                    // 2-8
	a.turn(2, "second")                                   // 9-15: echo 9, working 10, turn_started 11, delta 12, text 13, idle 14, result 15
	s, _ := js.Stream(t.Context(), schemas.StreamName)
	if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(12)); err != nil { // 1-11 gone: turn 2's start
		t.Fatal(err)
	}
	var c collected
	err := f.Replay(t.Context(), []string{"midturn"}, client.From{Turn: 2}, false, c.fn)
	if schemas.CodeOf(err) != schemas.CodeNotFound || !strings.Contains(err.Error(), "turn 2 of agent midturn is past the stream's retention") || !strings.Contains(err.Error(), "part way through turn 2") {
		t.Errorf("replay (no follow) from turn 2 whose start aged out: %v, %d events (want: turn 2 is past the stream's retention)", err, len(c.evs))
	}
	if page, err := f.Events(t.Context(), schemas.EventsRequest{AgentID: "midturn", FromTurn: 2}); err == nil {
		t.Errorf("agent_events page from turn 2 whose start aged out: no error, %d events, gaps %+v", len(page.Events), page.Gaps)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var fc collected
	err = f.Replay(ctx, []string{"midturn"}, client.From{Turn: 2}, true, fc.fn)
	if ctx.Err() != nil || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("replay (follow) from turn 2 whose start aged out: %d events, err %v (still waiting: %v)", len(fc.evs), err, ctx.Err() != nil)
	}
}
