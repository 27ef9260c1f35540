package coordinator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A confined node (node credentials, everything through the relay) whose
// agent the coordinator closed as lost, the close cut off before its
// events were stored (the record keeps `closing`), may not write that
// record again, even with `closing` and `closed_by` as they are: its
// `last_event` lowered to the close's From made the close one the
// monitor could not take for its own, and the stream never ended dead
// while the record kept its close for ever. A life the coordinator
// closed is the coordinator's record; the monitor finishes the close.
func TestConfinedNodeCannotWedgeACloseByLoweringItsRecord(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 90*time.Second)
	kv, js, claim := givenMine(t, s, ctx)
	put := func(rec schemas.AgentRecord) error { t.Helper(); return relayRecord(t, ctx, kv, js, rec) }
	rec := claim
	rec.Status, rec.EventLog = schemas.StatusIdle, "mine.jsonl"
	if err := put(rec); err != nil {
		t.Fatal(err)
	}
	// Mid-turn: the turn's start and some text.
	relayEvents(t, ctx, js,
		schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}},
		schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("half a")}})
	rec.Status, rec.Turn, rec.LastEvent = schemas.StatusWorking, 1, 2
	if err := put(rec); err != nil {
		t.Fatal(err)
	}

	// The coordinator takes nb for lost and writes the close, then stops
	// before storing its events (closefabric_test.go's cutOffClose).
	stream, err := s.F.JetStream().Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	var live schemas.AgentRecord
	if err := json.Unmarshal(e.Value(), &live); err != nil {
		t.Fatal(err)
	}
	tail, _, err := client.StreamTail(ctx, s.F.Conn(), stream, "mine")
	if err != nil {
		t.Fatal(err)
	}
	dead := schemas.CloseLost(live, tail, "node nb was lost", schemas.CloserName)
	if dead.Closing == nil {
		t.Fatal("the close keeps no closing")
	}
	putJSON(t, kv, "mine", dead)

	// nb writes its dead record back, the close as kept, its numbering lowered.
	lowered := dead
	lowered.LastEvent = dead.Closing.From
	if err := put(lowered); err == nil {
		t.Errorf("the relay stored nb's write of its dead record's last_event %d -> %d while the record keeps the coordinator's close", dead.LastEvent, lowered.LastEvent)
	}

	coord, err := s.B.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	m, err := coordinator.NewMonitor(coordinator.MonitorConfig{Conn: coord, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, m)
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := kv.Get(ctx, "mine")
		if err != nil {
			t.Fatal(err)
		}
		var now schemas.AgentRecord
		json.Unmarshal(e.Value(), &now)
		if now.Closing == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the coordinator never finished its close of mine: the record still keeps it (last_event %d, closing from %d)", now.LastEvent, now.Closing.From)
		}
		time.Sleep(100 * time.Millisecond)
	}
	end, _, err := client.StreamTail(ctx, s.F.Conn(), stream, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if !end.Dead || end.Last != dead.LastEvent {
		t.Errorf("mine's stream ends at %d (dead %v), want it closed at %d", end.Last, end.Dead, dead.LastEvent)
	}
}
