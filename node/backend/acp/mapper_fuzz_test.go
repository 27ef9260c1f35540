package acp

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// FuzzMapperUpdate feeds arbitrary bytes to update: it must not panic,
// every payload must encode and satisfy the JSON Schemas, and only the
// kinds Shoal deliberately drops may yield nothing.
func FuzzMapperUpdate(f *testing.F) {
	for _, name := range mapperTranscripts {
		for _, l := range mapperReadTranscript(f, name) {
			if len(l.Msg.Params.Update) > 0 {
				f.Add([]byte(l.Msg.Params.Update))
			}
		}
	}
	for _, s := range []string{
		``, `null`, `[]`, `"x"`, `{}`, `{"sessionUpdate":null}`, `{"sessionUpdate":"plan","entries":[{"content":"a","priority":3}]}`,
		`{"sessionUpdate":"agent_message_chunk","content":{"type":"resource","resource":{"uri":"u","blob":"AA=="}}}`,
		`{"sessionUpdate":"tool_call","toolCallId":"t","content":[{"type":"diff","path":"p","newText":"n"},{"type":"terminal"},7,null]}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"t","kind":7}`,
		`{"sessionUpdate":"usage_update","cost":{"amount":1e400}}`,
		"{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"\xff\xfe\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		m := newMapper()
		first := m.update(json.RawMessage(raw))
		out := slices.Concat(first, m.update(json.RawMessage(raw)), m.retire("cancelled"))
		for i, p := range out {
			b, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p})
			if err != nil {
				t.Fatalf("payload %d of %q does not encode: %v", i, raw, err)
			}
			if err := schematest.ValidateEvent(b); err != nil {
				t.Fatalf("payload %d of %q is invalid: %v\n%s", i, raw, err, b)
			}
		}
		if len(first) == 0 {
			var head struct {
				SessionUpdate string `json:"sessionUpdate"`
			}
			json.Unmarshal(raw, &head)
			if !slices.Contains([]string{"usage_update", "current_mode_update", "available_commands_update", "config_option_update", "session_info_update"}, head.SessionUpdate) {
				t.Fatalf("%q yielded nothing", raw)
			}
		}
		m.cost()
		m.takeTurnText()
	})
}
