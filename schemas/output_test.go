package schemas_test

import (
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// The agent's record is written after the events it sums up are stored:
// a reader that saw a turn's result on the stream and asks for its
// output at once may find the record still saying working. The stream
// is the later word: the turn is done, the agent as its last status
// event says (TestTurnLifecycle saw done false there, under load).
func TestOutputOfATurnWhoseRecordLagsTheStream(t *testing.T) {
	s := schemas.NewStored(1)
	text := func(delta bool, s string) schemas.AssistantText {
		return schemas.AssistantText{Delta: delta, Content: schemas.ContentBlock{Type: schemas.ContentText, Text: s}}
	}
	for _, ev := range []schemas.Event{
		{Turn: 0, Payload: schemas.Status{Status: schemas.StatusIdle}},
		{Turn: 1, Payload: schemas.Status{Status: schemas.StatusWorking}},
		{Turn: 1, Payload: schemas.TurnStarted{}},
		{Turn: 1, Payload: text(true, "echo: hel")},
		{Turn: 1, Payload: text(false, "echo: hello")},
	} {
		s.Add(ev)
	}
	working := &schemas.AgentRecord{ID: "a", Status: schemas.StatusWorking, Turn: 1}
	out, err := schemas.OutputOf(s, working, schemas.OutputRequest{AgentID: "a"})
	if err != nil || out.Done || out.Status != schemas.StatusWorking || out.Text != "echo: hel" {
		t.Fatalf("a turn under way: %+v %v", out, err)
	}

	s.Add(schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusIdle}})
	s.Add(schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn}})
	out, err = schemas.OutputOf(s, working, schemas.OutputRequest{AgentID: "a"})
	if err != nil || !out.Done || out.Status != schemas.StatusIdle || out.Text != "echo: hello" {
		t.Fatalf("a turn whose result is stored, its record still saying working: %+v %v", out, err)
	}

	// A second turn the record has begun, the stream not yet: not done.
	second := &schemas.AgentRecord{ID: "a", Status: schemas.StatusWorking, Turn: 2}
	out, err = schemas.OutputOf(s, second, schemas.OutputRequest{AgentID: "a"})
	if err != nil || out.Done || out.Turn != 2 || out.Status != schemas.StatusWorking {
		t.Fatalf("a turn begun on the record, not yet on the stream: %+v %v", out, err)
	}
}
