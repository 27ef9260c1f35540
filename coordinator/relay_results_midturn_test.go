package coordinator_test

// Results an honest node stores that the relay's rule of one result per
// turn must not refuse: a refusal (403) makes the node drop the event for
// good, every later event of the agent is refused as not following, and
// the stream never gets the turn's end nor the agent's death.

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// resultsEnv is ev's envelope.
func resultsEnv(t *testing.T, ev schemas.Event) []byte {
	t.Helper()
	b, err := schemas.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A node's agent runs turn 1; the user sends turn 2 meanwhile, so the node
// publishes turn 2's echo, stamped turn 1 (node/lifecycle.go send), while
// turn 1 still runs. The agent's process then exits: the node marks the
// record dead and publishes turn 1's error and cancelled result, turn 2's
// start, error and result, and status dead (node/agent.go die). The record
// reaches the relay before the closing events (the admit comment says it
// may). The relay refreshes its view from the stream's tail, an echo,
// which resulted() takes for "turn 1 has its result": turn 1's result is
// refused, and every event after it does not follow.
func TestRelayTakesTheResultOfATurnRunningBehindAHeldTurnsEcho(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	kv, js, claim := givenMine(t, s, ctx)
	publish := func(n uint64, ev schemas.Event) error {
		_, err := js.PublishMsg(ctx, relayEvent(n, resultsEnv(t, ev)))
		return err
	}
	for n, ev := range []schemas.Event{
		{Turn: 1, Payload: schemas.Status{Status: schemas.StatusWorking}},
		{Turn: 1, Payload: schemas.TurnStarted{}},
		{Turn: 1, Payload: schemas.UserText{Content: schemas.Text("turn 2, held")}}, // echo of turn 2
	} {
		if err := publish(uint64(n+1), ev); err != nil {
			t.Fatalf("event %d: %v", n+1, err)
		}
	}
	rec := claim
	rec.Status, rec.Turn, rec.Held, rec.LastEvent = schemas.StatusDead, 2, 0, 9
	if err := relayRecord(t, ctx, kv, js, rec); err != nil {
		t.Fatalf("the record of the agent's death: %v", err)
	}
	// Let the watch pass the record on (the relay's view says dead).
	time.Sleep(300 * time.Millisecond)
	closing := []schemas.Event{
		{Turn: 1, Payload: schemas.Errorf("the agent process exited during turn 1")},
		{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopCancelled}},
		{Turn: 2, Payload: schemas.TurnStarted{}},
		{Turn: 2, Payload: schemas.Errorf("turn 2 was dropped: the agent ended before it began")},
		{Turn: 2, Payload: schemas.Result{StopReason: schemas.StopCancelled}},
		{Turn: 2, Payload: schemas.Status{Status: schemas.StatusDead}},
	}
	for i, ev := range closing {
		if err := publish(uint64(4+i), ev); err != nil {
			t.Errorf("closing event %d (%s) refused: %v", 4+i, ev.Kind(), err)
		}
	}
}

// The relay is restarted (a coordinator restart) while turn 1 runs with
// turn 2 held: the stream's tail is turn 2's echo, stamped 1. The new
// relay reads it as "turn 1 has its result" and refuses turn 1's result
// when it comes; everything after is refused as not following.
func TestRelayRestartedMidTurnTakesItsResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail schemas.Event
	}{
		{"echo of a held turn", schemas.Event{Turn: 1, Payload: schemas.UserText{Content: schemas.Text("turn 2, held")}}},
		// node/agent.go finish publishes status idle, then the result.
		{"status idle before the result", schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusIdle}}},
		// node/lifecycle.go close emits status closed at the running turn;
		// the CLI then ends that turn with its result.
		{"status closed during the turn", schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusClosed}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
			if err != nil {
				t.Fatal(err)
			}
			b := natstest.Start(t, func(c *broker.Config) { c.Auth = auth })
			coord, err := b.Connect()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(coord.Close)
			stop := runRelay(t, coord)
			f, err := client.NewDirect(coord, client.Config{})
			if err != nil {
				t.Fatal(err)
			}
			s := &fabrictest.Secured{B: b, Auth: auth, F: f}
			ctx := natstest.Context(t, 60*time.Second)
			_, js, _ := givenMine(t, s, ctx)
			publish := func(n uint64, ev schemas.Event) error {
				_, err := js.PublishMsg(ctx, relayEvent(n, resultsEnv(t, ev)))
				return err
			}
			before := []schemas.Event{
				{Turn: 1, Payload: schemas.Status{Status: schemas.StatusWorking}},
				{Turn: 1, Payload: schemas.TurnStarted{}},
				tc.tail,
			}
			for i, ev := range before {
				if err := publish(uint64(i+1), ev); err != nil {
					t.Fatalf("event %d: %v", i+1, err)
				}
			}
			stop()
			t.Cleanup(runRelay(t, coord))
			after := []schemas.Event{
				{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn}},
				{Turn: 2, Payload: schemas.Status{Status: schemas.StatusWorking}},
			}
			for i, ev := range after {
				if err := publish(uint64(4+i), ev); err != nil {
					t.Errorf("event %d (%s) after the relay's restart refused: %v", 4+i, ev.Kind(), err)
				}
			}
		})
	}
}

var _ = json.Marshal
var _ = nats.NewMsg
var _ jetstream.JetStream
