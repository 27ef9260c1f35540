package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Kind names an event's payload type.
type Kind string

// The thirteen event kinds of Kaimon's envelope.
const (
	KindAssistantText  Kind = "assistant_text"
	KindThought        Kind = "thought"
	KindUserText       Kind = "user_text"
	KindToolUse        Kind = "tool_use"
	KindToolResult     Kind = "tool_result"
	KindToolInputDelta Kind = "tool_input_delta"
	KindPlan           Kind = "plan"
	KindUsage          Kind = "usage"
	KindTurnStarted    Kind = "turn_started"
	KindResult         Kind = "result"
	KindError          Kind = "error"
	KindStatus         Kind = "status"
	KindPermission     Kind = "permission"
)

// Kinds lists every kind, in the order Kaimon's documentation gives them.
var Kinds = []Kind{
	KindAssistantText, KindThought, KindUserText, KindToolUse, KindToolResult,
	KindToolInputDelta, KindPlan, KindUsage, KindTurnStarted, KindResult,
	KindError, KindStatus, KindPermission,
}

// Payload is the data of one event kind. Each kind has its own type.
type Payload interface {
	Kind() Kind
}

// payloadDecoder is implemented by a pointer to each payload type.
type payloadDecoder interface {
	decode(*fields)
}

// Event is one normalized agent event: a payload stamped with the agent's
// turn number. Its JSON form is the envelope {"kind","turn","data"}.
type Event struct {
	Turn    int
	Payload Payload
}

// Kind returns the payload's kind.
func (e Event) Kind() Kind { return e.Payload.Kind() }

// IsDelta reports whether the event exists only for liveness: a streamed
// text or thought chunk, or a tool input fragment. Logs and replay buffers
// skip these; the authoritative copies follow.
func (e Event) IsDelta() bool {
	switch p := e.Payload.(type) {
	case AssistantText:
		return p.Delta
	case Thought:
		return p.Delta
	case ToolInputDelta:
		return true
	}
	return false
}

// MarshalJSON writes the envelope {"kind","turn","data"}.
func (e Event) MarshalJSON() ([]byte, error) {
	if e.Payload == nil {
		return nil, fmt.Errorf("event has no payload")
	}
	if b, ok := appendEnvelope(make([]byte, 0, 128), e); ok {
		return b, nil
	}
	data, err := json.Marshal(e.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s event: %w", e.Payload.Kind(), err)
	}
	data = kaimonJSON(data)
	var b bytes.Buffer
	b.Grow(len(data) + 40)
	b.WriteString(`{"kind":"`)
	b.WriteString(string(e.Payload.Kind()))
	b.WriteString(`","turn":`)
	fmt.Fprint(&b, e.Turn)
	b.WriteString(`,"data":`)
	b.Write(data)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON decodes an envelope; see Decode.
func (e *Event) UnmarshalJSON(b []byte) error {
	ev, err := Decode(b)
	if err != nil {
		return err
	}
	*e = ev
	return nil
}

// Encode returns the envelope JSON of an event.
func Encode(e Event) ([]byte, error) { return e.MarshalJSON() }

// Decode parses and checks an envelope. A malformed one yields a
// *FieldError naming the field at fault.
func Decode(b []byte) (Event, error) {
	if ev, ok := decodeFast(b); ok {
		return ev, nil
	}
	var ev Event
	err := decodeInto(b, func(f *fields) {
		kind := Kind(f.str("kind"))
		ev.Turn = int(f.count("turn"))
		if *f.err != nil {
			return
		}
		p, ok := newPayload(kind)
		if !ok {
			f.fail("kind", fmt.Sprintf("unknown kind %q (want one of %s)", kind, kindList()))
			return
		}
		f.object("data", func(g *fields) { p.decode(g) })
		ev.Payload = derefPayload(p)
	})
	if err != nil {
		return Event{}, fmt.Errorf("malformed envelope: %w", err)
	}
	return ev, nil
}

func kindList() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// newPayload returns a pointer to a zero payload of the kind, to decode into.
func newPayload(k Kind) (payloadDecoder, bool) {
	switch k {
	case KindAssistantText:
		return &AssistantText{}, true
	case KindThought:
		return &Thought{}, true
	case KindUserText:
		return &UserText{}, true
	case KindToolUse:
		return &ToolUse{}, true
	case KindToolResult:
		return &ToolResult{}, true
	case KindToolInputDelta:
		return &ToolInputDelta{}, true
	case KindPlan:
		return &Plan{}, true
	case KindUsage:
		return &UsageUpdate{}, true
	case KindTurnStarted:
		return &TurnStarted{}, true
	case KindResult:
		return &Result{}, true
	case KindError:
		return &Error{}, true
	case KindStatus:
		return &Status{}, true
	case KindPermission:
		return &Permission{}, true
	}
	return nil, false
}

// derefPayload turns the decoded pointer back into the value type that
// producers use, so a type switch sees one spelling of each kind.
func derefPayload(p payloadDecoder) Payload {
	switch v := p.(type) {
	case *AssistantText:
		return *v
	case *Thought:
		return *v
	case *UserText:
		return *v
	case *ToolUse:
		return *v
	case *ToolResult:
		return *v
	case *ToolInputDelta:
		return *v
	case *Plan:
		return *v
	case *UsageUpdate:
		return *v
	case *TurnStarted:
		return *v
	case *Result:
		return *v
	case *Error:
		return *v
	case *Status:
		return *v
	case *Permission:
		return *v
	}
	panic(fmt.Sprintf("schemas: no payload type for %T", p))
}
