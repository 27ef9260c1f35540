package coordinator_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A turn's result is what the fleet's count charges, to the node the
// event names and its labels. A confined node stored a second result of a
// turn that had ended, and a result of turn 0, each counted; and an event
// without Shoal-Node was charged to no node (so to no label of its). The
// relay stores one result per turn (a retry of its number is still a
// duplicate, not a refusal), none of turn 0, and every event it stores
// names the node it came from.
func TestRelayStoresOneResultPerTurnAndNamesItsNode(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	_, js, _ := givenMine(t, s, ctx)
	used := func(n int64) *schemas.Usage { return &schemas.Usage{InputTokens: n} }
	publish := func(n uint64, ev schemas.Event, named bool) (*jetstream.PubAck, error) {
		env, err := schemas.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		m := relayEvent(n, env)
		if !named {
			m.Header.Del(schemas.HeaderNode)
		}
		return js.PublishMsg(ctx, m)
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Fatalf("%s: got %v, want a refusal about %q", what, err, want)
		}
	}
	stored := func(n uint64, ev schemas.Event, named bool) {
		t.Helper()
		if ack, err := publish(n, ev, named); err != nil || ack.Duplicate {
			t.Fatalf("event %d (%s): %+v %v", n, ev.Kind(), ack, err)
		}
	}
	stored(1, schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}, true)
	stored(2, schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: used(10)}}, true)
	_, err := publish(3, schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: used(1 << 39)}}, true)
	refused("a second result of turn 1", err, "turn 1 has had its result")
	_, err = publish(3, schemas.Event{Turn: 0, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: used(1 << 39)}}, true)
	refused("a result of turn 0", err, "turns are numbered from 1")
	stored(3, schemas.Event{Turn: 2, Payload: schemas.TurnStarted{}}, false)
	stored(4, schemas.Event{Turn: 2, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: used(20)}}, false)
	if ack, err := publish(4, schemas.Event{Turn: 2, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: used(20)}}, false); err != nil || !ack.Duplicate {
		t.Fatalf("a retry of event 4, turn 2's result: %+v %v, want a duplicate", ack, err)
	}

	stream, err := s.F.JetStream().Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject("mine")}})
	if err != nil {
		t.Fatal(err)
	}
	var results int
	for n := uint64(1); ; n++ {
		m, err := c.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if n != 5 {
				t.Fatalf("the stream holds %d of agent mine's events, want 4", n-1)
			}
			break
		}
		if got := m.Headers().Get(schemas.HeaderNode); got != "nb" {
			t.Errorf("event %s names node %q, want nb", m.Headers().Get(schemas.HeaderMsgID), got)
		}
		if ev, err := schemas.Decode(m.Data()); err == nil {
			if r, ok := ev.Payload.(schemas.Result); ok {
				results++
				if r.Usage == nil || r.Usage.InputTokens > 20 {
					t.Errorf("a forged result was stored: %+v", r)
				}
			}
		}
	}
	if results != 2 {
		t.Errorf("%d results stored, want turn 1's and turn 2's", results)
	}
}
