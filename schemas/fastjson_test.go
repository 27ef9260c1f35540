package schemas

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The hand-written encoder writes exactly what the other kinds' path
// writes: encoding/json's, made Kaimon's.
func TestAppendEnvelopeMatchesEncodingJSON(t *testing.T) {
	texts := []string{"", "plain", "quote\" back\\slash", "<tag> & amp", "tab\tnew\nline\r\b\f", "\x00\x01\x1f\x7f",
		"héllo 世界 🎉", "bad \xff utf8 \xc3", "line\u2028sep\u2029", "emoji \U0001F600 end"}
	for _, s := range texts {
		for _, ev := range []Event{
			{Turn: 3, Payload: AssistantText{Delta: true, Content: Text(s)}},
			{Turn: 0, Payload: Thought{Content: Text(s)}},
			{Turn: 12, Payload: ToolInputDelta{ToolCallID: s, PartialJSON: s}},
			{Turn: 1, Payload: Status{Status: AgentStatus(s)}},
			{Turn: 9, Payload: TurnStarted{}},
		} {
			fast, ok := appendEnvelope(nil, ev)
			if !ok {
				t.Fatalf("%T has no fast path", ev.Payload)
			}
			data, err := json.Marshal(ev.Payload)
			if err != nil {
				t.Fatal(err)
			}
			slow := []byte(`{"kind":"` + string(ev.Kind()) + `","turn":` + itoa(ev.Turn) + `,"data":` + string(kaimonJSON(data)) + `}`)
			if !bytes.Equal(fast, slow) {
				t.Errorf("%T %q:\nfast %s\nslow %s", ev.Payload, s, fast, slow)
			}
		}
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("a<b>&\"\\\n\x00\xff\u2028")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		want = kaimonJSON(want)
		if got := AppendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s want %s", s, got, want)
		}
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// Whatever the fast decoder accepts, the full one reads the same way.
func FuzzDecodeFast(f *testing.F) {
	for _, ev := range []Event{
		{Turn: 3, Payload: AssistantText{Delta: true, Content: Text("a \"quoted\" <b> \u2028 é \\ end")}},
		{Turn: 10, Payload: Thought{Content: Text("")}},
		{Turn: 2, Payload: ToolInputDelta{ToolCallID: "t1", PartialJSON: `{"a":`}},
		{Turn: 0, Payload: Status{Status: StatusIdle}},
		{Turn: 7, Payload: TurnStarted{}},
	} {
		b, _ := appendEnvelope(nil, ev)
		f.Add(b)
	}
	f.Add([]byte(`{"kind":"status","turn":01,"data":{"status":"idle"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := decodeFast(b)
		if !ok {
			return
		}
		var slow Event
		err := decodeInto(b, func(fl *fields) {
			kind := Kind(fl.str("kind"))
			slow.Turn = int(fl.count("turn"))
			p, _ := newPayload(kind)
			if p == nil {
				fl.fail("kind", "unknown")
				return
			}
			fl.object("data", func(g *fields) { p.decode(g) })
			slow.Payload = derefPayload(p)
		})
		if err != nil {
			t.Fatalf("fast read %q as %+v, the full decoder refuses it: %v", b, fast, err)
		}
		fb, _ := Encode(fast)
		sb, _ := Encode(slow)
		if string(fb) != string(sb) {
			t.Fatalf("%q: fast %s, full %s", b, fb, sb)
		}
	})
}

// Peek agrees with a full decode.
func FuzzPeek(f *testing.F) {
	for _, ev := range []Event{
		{Turn: 3, Payload: AssistantText{Delta: true, Content: Text("x")}},
		{Turn: 4, Payload: Thought{Content: Text("y")}},
		{Turn: 2, Payload: ToolInputDelta{ToolCallID: "t1", PartialJSON: `{"a":`}},
		{Turn: 1, Payload: Result{StopReason: StopEndTurn}},
		{Turn: 1, Payload: ToolUse{Call: ToolCall{ToolCallID: "a"}}},
	} {
		b, _ := Encode(ev)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Decode(b)
		if err != nil {
			return
		}
		kind, turn, delta, err := Peek(b)
		if err != nil || kind != ev.Kind() || turn != ev.Turn || delta != ev.IsDelta() {
			t.Fatalf("%q: peek %s %d %v %v, decode %s %d %v", b, kind, turn, delta, err, ev.Kind(), ev.Turn, ev.IsDelta())
		}
	})
}
