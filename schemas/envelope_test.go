package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

func line(n int) *int      { return &n }
func str(s string) *string { return &s }

// samples has at least one event of every kind, and every content variant.
func samples() []schemas.Event {
	status := schemas.ToolCompleted
	kind := schemas.ToolRead
	return []schemas.Event{
		{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("two-")}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("two-state paramagnet…")}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Image("iVBORw0KGgo=", "image/png")}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.ContentBlock{Type: "image", Data: "AA==", MimeType: "image/jpeg", URI: "file:///a.jpg"}}},
		{Turn: 1, Payload: schemas.Thought{Delta: true, Content: schemas.Text("hmm")}},
		{Turn: 2, Payload: schemas.Thought{Content: schemas.Text("hmm, yes")}},
		{Turn: 0, Payload: schemas.UserText{Content: schemas.Text("hi")}},
		{Turn: 0, Payload: schemas.UserText{Content: schemas.ContentBlock{Type: "audio", Data: "UklGRg==", MimeType: "audio/wav"}}},
		{Turn: 0, Payload: schemas.UserText{Content: schemas.ContentBlock{Type: "resource_link", URI: "file:///x", Name: "x"}}},
		{Turn: 0, Payload: schemas.UserText{Content: schemas.ContentBlock{Type: "resource", URI: "file:///y", Text: "body", MimeType: "text/plain"}}},
		{Turn: 0, Payload: schemas.UserText{Content: schemas.ContentBlock{Type: "resource", URI: "file:///z", Blob: "AAE="}}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "tu1", Title: "Read", Kind: schemas.ToolRead, Status: schemas.ToolInProgress}}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{
			ToolCallID: "tu2", Title: "Edit", Kind: schemas.ToolEdit, Status: schemas.ToolPending,
			Content: []schemas.ToolCallContent{
				{Type: "diff", Path: "/p/a.go", OldText: str("old"), NewText: "new"},
				{Type: "diff", Path: "/p/new.go", NewText: "fresh"},
				{Type: "terminal", TerminalID: "t1"},
				schemas.ToolText("note"),
			},
			Locations: []schemas.Location{{Path: "/p/a.go", Line: line(3)}, {Path: "/p/b.go"}},
			RawInput:  json.RawMessage(`{"file_path":"/p/a.go"}`),
			RawOutput: json.RawMessage(`"done"`),
		}}},
		{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "tu1", Status: &status,
			Content: []schemas.ToolCallContent{schemas.ToolText("ok"), schemas.ToolBlock(schemas.Image("AA==", "image/png"))}}}},
		{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "tu1", Title: str("Read a.go"), Kind: &kind,
			Locations: []schemas.Location{{Path: "/p"}}, RawInput: json.RawMessage(`{}`), RawOutput: json.RawMessage(`[1,2]`)}}},
		{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "tu2", Content: []schemas.ToolCallContent{}, Locations: []schemas.Location{}}}},
		{Turn: 1, Payload: schemas.ToolInputDelta{ToolCallID: "tu1", PartialJSON: `{"file_`}},
		{Turn: 1, Payload: schemas.Plan{Entries: []schemas.PlanEntry{{Content: "read", Priority: schemas.PriorityHigh, Status: schemas.PlanInProgress}}}},
		{Turn: 1, Payload: schemas.Plan{}},
		{Turn: 1, Payload: schemas.UsageUpdate{Usage: schemas.Usage{InputTokens: 1, CostUSD: schemas.Cost(0.5)}}},
		{Turn: 1, Payload: schemas.TurnStarted{}},
		{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn, Usage: &schemas.Usage{InputTokens: 100, OutputTokens: 50, CacheReadTokens: 10, CostUSD: schemas.Cost(0)}}},
		{Turn: 3, Payload: schemas.Result{StopReason: schemas.StopCancelled}},
		{Turn: 1, Payload: schemas.Errorf("stream-json parse error")},
		{Turn: 1, Payload: schemas.ErrorWith("agent turn failed", map[string]any{"subtype": "success", "is_error": true})},
		{Turn: 0, Payload: schemas.Status{Status: schemas.StatusIdle}},
		{Turn: 4, Payload: schemas.Status{Status: schemas.StatusClosed}},
		{Turn: 1, Payload: schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: "tu9"}, RequestID: "7",
			Options: []schemas.PermissionOption{{OptionID: "allow", Name: "Allow", Kind: schemas.PermissionAllowOnce}, {OptionID: "reject", Name: "Reject", Kind: schemas.PermissionRejectOnce}}}},
	}
}

func TestEveryKindHasSamples(t *testing.T) {
	seen := map[schemas.Kind]bool{}
	for _, ev := range samples() {
		seen[ev.Kind()] = true
	}
	for _, k := range schemas.Kinds {
		if !seen[k] {
			t.Errorf("no sample of kind %s", k)
		}
	}
	if len(schemas.Kinds) != 13 {
		t.Errorf("Kaimon has 13 kinds, schemas.Kinds has %d", len(schemas.Kinds))
	}
}

func TestRoundTrip(t *testing.T) {
	for _, ev := range samples() {
		b, err := schemas.Encode(ev)
		if err != nil {
			t.Fatalf("encode %+v: %v", ev, err)
		}
		schematest.Event(t, b)
		got, err := schemas.Decode(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if got.Turn != ev.Turn || got.Kind() != ev.Kind() {
			t.Fatalf("decode %s: got turn %d kind %s", b, got.Turn, got.Kind())
		}
		if want := decodedForm(ev.Payload); !reflect.DeepEqual(got.Payload, want) {
			t.Errorf("decode %s:\n got %#v\nwant %#v", b, got.Payload, want)
		}
		again, err := schemas.Encode(got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, b) {
			t.Errorf("re-encode differs:\n first %s\nsecond %s", b, again)
		}
	}
}

// decodedForm is p as Decode returns it: the lists a tool_use or a plan
// always carries are written as [] when nil, and so come back empty, not
// nil. Every other value must come back exactly as it was encoded.
func decodedForm(p schemas.Payload) schemas.Payload {
	switch p := p.(type) {
	case schemas.ToolUse:
		if p.Call.Content == nil {
			p.Call.Content = []schemas.ToolCallContent{}
		}
		if p.Call.Locations == nil {
			p.Call.Locations = []schemas.Location{}
		}
		return p
	case schemas.Plan:
		if p.Entries == nil {
			p.Entries = []schemas.PlanEntry{}
		}
		return p
	}
	return p
}

// The examples of Kaimon's documentation decode and re-encode to the same
// JSON (key order aside).
func TestKaimonExamples(t *testing.T) {
	examples := []string{
		`{"kind":"assistant_text","turn":1,"data":{"delta":true,"content":{"type":"text","text":"two-"}}}`,
		`{"kind":"thought","turn":1,"data":{"delta":true,"content":{"type":"text","text":"…"}}}`,
		`{"kind":"tool_use","turn":1,"data":{"call":{"toolCallId":"tu1","title":"Read","kind":"read","status":"in_progress","content":[],"locations":[],"rawInput":{"file_path":"/a"},"rawOutput":null}}}`,
		`{"kind":"tool_result","turn":1,"data":{"update":{"toolCallId":"tu1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"ok"}}]}}}`,
		`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":{"inputTokens":100,"outputTokens":50,"cacheReadTokens":10,"cacheCreationTokens":0,"costUsd":0.0}}}`,
		`{"kind":"status","turn":1,"data":{"status":"working"}}`,
		`{"kind":"turn_started","turn":1,"data":{}}`,
		`{"kind":"plan","turn":1,"data":{"entries":[{"content":"…","priority":"high","status":"pending"}]}}`,
		`{"kind":"permission","turn":1,"data":{"toolCall":{"toolCallId":"x"},"options":[{"optionId":"a","name":"Allow","kind":"allow_once"}],"requestId":"3"}}`,
		`{"kind":"error","turn":1,"data":{"message":"boom","data":null}}`,
		`{"kind":"user_text","turn":0,"data":{"content":{"type":"text","text":"hi"}}}`,
		`{"kind":"tool_input_delta","turn":1,"data":{"toolCallId":"tu1","partialJson":"{\"a"}}`,
		`{"kind":"status","turn":0,"data":{"status":"idle"}}`,
	}
	for _, ex := range examples {
		schematest.Event(t, []byte(ex))
		ev, err := schemas.Decode([]byte(ex))
		if err != nil {
			t.Fatalf("decode %s: %v", ex, err)
		}
		out, err := schemas.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(t, out, []byte(ex)) {
			t.Errorf("Kaimon example changed shape:\n  in %s\n out %s", ex, out)
		}
	}
}

// The worked example of Kaimon's bus section is byte-exact.
func TestStatusBytes(t *testing.T) {
	b, err := schemas.Encode(schemas.Event{Turn: 0, Payload: schemas.Status{Status: schemas.StatusIdle}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kind":"status","turn":0,"data":{"status":"idle"}}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
}

// A status event carries idle, working, dead or closed. An agent is
// starting only in its record: agent_open publishes status idle when it
// completes, and starting is never published (Kaimon §1.6).
func TestStatusEventIsNeverStarting(t *testing.T) {
	for _, s := range []schemas.AgentStatus{schemas.StatusIdle, schemas.StatusWorking, schemas.StatusDead, schemas.StatusClosed} {
		schematest.Event(t, []byte(`{"kind":"status","turn":0,"data":{"status":"`+string(s)+`"}}`))
	}
	starting := []byte(`{"kind":"status","turn":0,"data":{"status":"starting"}}`)
	if err := schematest.Validate("envelope", starting); err == nil {
		t.Errorf("the JSON Schema accepts a status event %s", starting)
	}
	if err := schematest.Validate("kinds/status", []byte(`{"status":"starting"}`)); err == nil {
		t.Errorf("kinds/status.json accepts starting")
	}
	record := schemas.AgentRecord{ID: "a1", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/p", Node: "n1"}
	b, err := json.Marshal(record)
	if err != nil {
		t.Fatal(err)
	}
	schematest.Control(t, "agent_record", b)
}

func TestToolUseCarriesEveryKey(t *testing.T) {
	b, err := json.Marshal(schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"call":{"toolCallId":"x","title":"","kind":"other","status":"pending","content":[],"locations":[],"rawInput":null,"rawOutput":null}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
}

func TestToolResultCarriesOnlySetFields(t *testing.T) {
	failed := schemas.ToolFailed
	cases := []struct {
		update schemas.ToolCallUpdate
		want   string
	}{
		{schemas.ToolCallUpdate{ToolCallID: "x"}, `{"update":{"toolCallId":"x"}}`},
		{schemas.ToolCallUpdate{ToolCallID: "x", Status: &failed}, `{"update":{"toolCallId":"x","status":"failed"}}`},
		{schemas.ToolCallUpdate{ToolCallID: "x", Content: []schemas.ToolCallContent{}}, `{"update":{"toolCallId":"x","content":[]}}`},
		{schemas.ToolCallUpdate{ToolCallID: "x", RawOutput: json.RawMessage(`{"a":1}`)}, `{"update":{"toolCallId":"x","rawOutput":{"a":1}}}`},
	}
	for _, c := range cases {
		b, err := json.Marshal(schemas.ToolResult{Update: c.update})
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("got %s, want %s", b, c.want)
		}
		schematest.Event(t, []byte(`{"kind":"tool_result","turn":1,"data":`+string(b)+`}`))
	}
}

func TestEnumFallbacks(t *testing.T) {
	ev, err := schemas.Decode([]byte(`{"kind":"tool_use","turn":1,"data":{"call":{"toolCallId":"a","title":"t","kind":"teleport","status":"exploded","content":[],"locations":[],"rawInput":null,"rawOutput":null}}}`))
	if err != nil {
		t.Fatal(err)
	}
	call := ev.Payload.(schemas.ToolUse).Call
	if call.Kind != schemas.ToolOther || call.Status != schemas.ToolPending {
		t.Errorf("got kind %q status %q, want other/pending", call.Kind, call.Status)
	}
	ev, err = schemas.Decode([]byte(`{"kind":"result","turn":1,"data":{"stopReason":"tired","usage":null}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := ev.Payload.(schemas.Result); r.StopReason != schemas.StopEndTurn || r.Usage != nil {
		t.Errorf("got %+v, want end_turn with null usage", r)
	}
	ev, err = schemas.Decode([]byte(`{"kind":"plan","turn":1,"data":{"entries":[{"content":"c","priority":"urgent","status":"blocked"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e := ev.Payload.(schemas.Plan).Entries[0]; e.Priority != schemas.PriorityMedium || e.Status != schemas.PlanPending {
		t.Errorf("got %+v, want medium/pending", e)
	}
	ev, err = schemas.Decode([]byte(`{"kind":"permission","turn":1,"data":{"toolCall":{"toolCallId":"a"},"options":[{"optionId":"o","name":"n","kind":"maybe"}],"requestId":"1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if k := ev.Payload.(schemas.Permission).Options[0].Kind; k != schemas.PermissionAllowOnce {
		t.Errorf("got %q, want allow_once", k)
	}
	// Encoding coerces too, so a producer cannot put an unknown value on the wire.
	b, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: "bored"}})
	schematest.Event(t, b)
	if !strings.Contains(string(b), `"stopReason":"end_turn"`) {
		t.Errorf("unknown stop reason not coerced on encode: %s", b)
	}
}

func TestToolKindForName(t *testing.T) {
	cases := map[string]schemas.ToolKind{
		"Read": schemas.ToolRead, "NotebookRead": schemas.ToolRead, "Edit": schemas.ToolEdit, "Write": schemas.ToolEdit,
		"MultiEdit": schemas.ToolEdit, "NotebookEdit": schemas.ToolEdit, "Bash": schemas.ToolExecute,
		"mcp__x__exec_cmd": schemas.ToolExecute, "Grep": schemas.ToolSearch, "Glob": schemas.ToolSearch,
		"ToolSearch": schemas.ToolSearch, "WebFetch": schemas.ToolFetch, "WebSearch": schemas.ToolSearch,
		"TodoWrite": schemas.ToolThink, "Task": schemas.ToolOther,
	}
	for name, want := range cases {
		if got := schemas.ToolKindForName(name); got != want {
			t.Errorf("ToolKindForName(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestMalformedNamesTheField(t *testing.T) {
	cases := []struct{ in, field string }{
		{`[]`, ``},
		{`{"turn":1,"data":{}}`, `"kind"`},
		{`{"kind":"status","data":{"status":"idle"}}`, `"turn"`},
		{`{"kind":"status","turn":-1,"data":{"status":"idle"}}`, `"turn"`},
		{`{"kind":"status","turn":"one","data":{"status":"idle"}}`, `"turn"`},
		{`{"kind":"status","turn":1.5,"data":{"status":"idle"}}`, `"turn"`},
		{`{"kind":"gossip","turn":1,"data":{}}`, `"kind"`},
		{`{"kind":"status","turn":1}`, `"data"`},
		{`{"kind":"status","turn":1,"data":[]}`, `"data"`},
		{`{"kind":"status","turn":1,"data":{"status":"asleep"}}`, `"data.status"`},
		{`{"kind":"status","turn":1,"data":{"status":"starting"}}`, `"data.status"`},
		{`{"kind":"assistant_text","turn":1,"data":{"delta":"yes","content":{"type":"text","text":"a"}}}`, `"data.delta"`},
		{`{"kind":"assistant_text","turn":1,"data":{"delta":true}}`, `"data.content"`},
		{`{"kind":"assistant_text","turn":1,"data":{"content":{"type":"hologram"}}}`, `"data.content.type"`},
		{`{"kind":"assistant_text","turn":1,"data":{"content":{"type":"text","text":7}}}`, `"data.content.text"`},
		{`{"kind":"assistant_text","turn":1,"data":{"content":{"type":"image","data":"AA=="}}}`, `"data.content.mimeType"`},
		{`{"kind":"tool_use","turn":1,"data":{"call":{"toolCallId":"a","title":"t","kind":"read","status":"pending","content":[{"type":"diff","path":"p"}],"locations":[],"rawInput":null,"rawOutput":null}}}`, `"data.call.content[0].newText"`},
		{`{"kind":"tool_use","turn":1,"data":{"call":{"toolCallId":"a","title":"t","kind":"read","status":"pending","content":[],"locations":[{"path":"p","line":"x"}],"rawInput":null,"rawOutput":null}}}`, `"data.call.locations[0].line"`},
		{`{"kind":"tool_result","turn":1,"data":{"update":{"status":"completed"}}}`, `"data.update.toolCallId"`},
		{`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":{"inputTokens":1}}}`, `"data.usage.outputTokens"`},
		{`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":{"inputTokens":1,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":-0.5}}}`, `"data.usage.costUsd"`},
		{`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":{"inputTokens":1,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":1e308}}}`, `"data.usage.costUsd"`},
		{`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":{"inputTokens":9223372036854775807,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":null}}}`, `"data.usage.inputTokens"`},
		{`{"kind":"usage","turn":1,"data":{"usage":{"inputTokens":1,"outputTokens":0,"cacheReadTokens":2000000000000,"cacheCreationTokens":0,"costUsd":null}}}`, `"data.usage.cacheReadTokens"`},
		{`{"kind":"error","turn":1,"data":{"data":null}}`, `"data.message"`},
		{`{"kind":"permission","turn":1,"data":{"toolCall":{},"options":[],"requestId":"1"}}`, `"data.toolCall.toolCallId"`},
		{`{"kind":"permission","turn":1,"data":{"toolCall":{"toolCallId":"a"},"options":{},"requestId":"1"}}`, `"data.options"`},
		{`{"kind":"plan","turn":1,"data":{"entries":[{"priority":"high"}]}}`, `"data.entries[0].content"`},
		{`{"kind":"tool_input_delta","turn":1,"data":{"toolCallId":"a"}}`, `"data.partialJson"`},
	}
	for _, c := range cases {
		_, err := schemas.Decode([]byte(c.in))
		if err == nil {
			t.Errorf("Decode(%s) accepted a malformed envelope", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("Decode(%s) = %q, want it to name %s", c.in, err, c.field)
		}
		if _, ok := errors.AsType[*schemas.FieldError](err); !ok {
			t.Errorf("Decode(%s) error %T is not a *FieldError", c.in, err)
		}
		if schematest.ValidateEvent([]byte(c.in)) == nil {
			t.Errorf("the JSON Schema accepts %s", c.in)
		}
	}
}

func TestIsDelta(t *testing.T) {
	for _, ev := range samples() {
		want := false
		switch p := ev.Payload.(type) {
		case schemas.AssistantText:
			want = p.Delta
		case schemas.Thought:
			want = p.Delta
		case schemas.ToolInputDelta:
			want = true
		}
		if ev.IsDelta() != want {
			t.Errorf("%s IsDelta = %v", ev.Kind(), ev.IsDelta())
		}
	}
}

func TestUsageAdd(t *testing.T) {
	var s schemas.Usage
	s.Add(schemas.Usage{InputTokens: 1, OutputTokens: 2})
	if s.CostUSD != nil {
		t.Fatalf("null + null cost = %v, want null", *s.CostUSD)
	}
	s.Add(schemas.Usage{InputTokens: 10, CacheReadTokens: 3, CostUSD: schemas.Cost(0.25)})
	s.Add(schemas.Usage{CacheCreationTokens: 4, CostUSD: schemas.Cost(0.5)})
	want := schemas.Usage{InputTokens: 11, OutputTokens: 2, CacheReadTokens: 3, CacheCreationTokens: 4, CostUSD: schemas.Cost(0.75)}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v cost %v, want %+v", s, *s.CostUSD, want)
	}
}

// A usage figure no turn can reach is refused where it is decoded, and
// the refusal says which figure and why; a sum saturates rather than
// wrapping, so it always encodes.
func TestUsageIsBounded(t *testing.T) {
	for in, want := range map[string]string{
		`{"inputTokens":0,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":-1}`:                     `field "data.usage.costUsd": a cost must not be negative, got -1`,
		`{"inputTokens":0,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":1e308}`:                  `field "data.usage.costUsd": a turn's cost is at most $1e+06 (schemas.MaxTurnCostUSD), got 1e+308`,
		`{"inputTokens":0,"outputTokens":9223372036854775807,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":null}`: `field "data.usage.outputTokens": a turn uses at most 1099511627776 tokens of a kind (schemas.MaxTurnTokens), got 9223372036854775807`,
	} {
		_, err := schemas.Decode([]byte(`{"kind":"result","turn":1,"data":{"stopReason":"end_turn","usage":` + in + `}}`))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a result with usage %s: %v, want %q", in, err, want)
		}
	}
	// A sum of many turns may pass one turn's bound.
	var sum schemas.Usage
	if err := json.Unmarshal([]byte(`{"inputTokens":9223372036854775807,"outputTokens":0,"cacheReadTokens":0,"cacheCreationTokens":0,"costUsd":1e300}`), &sum); err != nil {
		t.Fatalf("a sum past one turn's bound: %v", err)
	}
	sum.Add(schemas.Usage{InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64, CostUSD: schemas.Cost(math.MaxFloat64)})
	sum.Add(schemas.Usage{OutputTokens: math.MaxInt64, CostUSD: schemas.Cost(math.MaxFloat64)})
	if sum.InputTokens != math.MaxInt64 || sum.OutputTokens != math.MaxInt64 || *sum.CostUSD != math.MaxFloat64 || schemas.TokensOf(sum) != math.MaxInt64 {
		t.Fatalf("the sum wrapped: %+v cost %g, tokens %d", sum, *sum.CostUSD, schemas.TokensOf(sum))
	}
	if _, err := json.Marshal(sum); err != nil {
		t.Fatalf("a saturated sum does not encode: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, ev := range samples() {
		b, _ := schemas.Encode(ev)
		f.Add(b)
	}
	f.Add([]byte(`{"kind":"status","turn":0,"data":{"status":"idle"}}`))
	f.Add([]byte(`{"kind":1}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		ev, err := schemas.Decode(in)
		if err != nil {
			return
		}
		out, err := schemas.Encode(ev)
		if err != nil {
			t.Fatalf("decoded %s but cannot encode it: %v", in, err)
		}
		if err := schematest.ValidateEvent(out); err != nil {
			t.Fatalf("decoded %s, re-encoded to invalid %s: %v", in, out, err)
		}
		again, err := schemas.Decode(out)
		if err != nil {
			t.Fatal(err)
		}
		out2, _ := schemas.Encode(again)
		if !bytes.Equal(out, out2) {
			t.Fatalf("not stable: %s then %s", out, out2)
		}
	})
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// Clamped holds a backend's figures to one turn's range, so a result
// made of them decodes.
func TestUsageClamped(t *testing.T) {
	for _, c := range []struct {
		in, want schemas.Usage
		ok       bool
	}{
		{schemas.Usage{InputTokens: 5, OutputTokens: 7, CostUSD: schemas.Cost(0.5)}, schemas.Usage{InputTokens: 5, OutputTokens: 7, CostUSD: schemas.Cost(0.5)}, true},
		{schemas.Usage{}, schemas.Usage{}, true},
		{schemas.Usage{InputTokens: -5, CacheReadTokens: math.MaxInt64}, schemas.Usage{CacheReadTokens: schemas.MaxTurnTokens}, false},
		{schemas.Usage{OutputTokens: math.MinInt64, CostUSD: schemas.Cost(-1)}, schemas.Usage{CostUSD: schemas.Cost(0)}, false},
		{schemas.Usage{CacheCreationTokens: 3, CostUSD: schemas.Cost(1e300)}, schemas.Usage{CacheCreationTokens: 3, CostUSD: schemas.Cost(schemas.MaxTurnCostUSD)}, false},
		{schemas.Usage{CostUSD: schemas.Cost(math.NaN())}, schemas.Usage{}, false},
	} {
		got, ok := c.in.Clamped()
		if ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v clamped: %+v %v, want %+v %v", c.in, got, ok, c.want, c.ok)
		}
		b, _ := json.Marshal(schemas.Event{Turn: 1, Payload: schemas.Result{StopReason: "end_turn", Usage: &got}})
		if _, err := schemas.Decode(b); err != nil {
			t.Errorf("a result of %+v: %v", got, err)
		}
	}
}
