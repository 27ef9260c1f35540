package schemas

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The hand-written encoder writes exactly what encoding/json writes.
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
			slow := []byte(`{"kind":"` + string(ev.Kind()) + `","turn":` + itoa(ev.Turn) + `,"data":` + string(data) + `}`)
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
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s want %s", s, got, want)
		}
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
