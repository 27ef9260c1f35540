package claude

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// transcriptLines returns a transcript's stdout lines, and for each
// whether an interrupt had been requested and not yet answered by a
// result when it was read.
func transcriptLines(t *testing.T, path string) (lines [][]byte, interrupted []bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	annotated := strings.Contains(path, ".annotated.")
	pending := false
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		if annotated {
			var a struct {
				Dir  string          `json:"dir"`
				Line json.RawMessage `json:"line"`
			}
			if err := json.Unmarshal(line, &a); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if a.Dir == "in" {
				if bytes.Contains(a.Line, []byte(`"interrupt"`)) {
					pending = true
				}
				continue
			}
			line = a.Line
		}
		lines = append(lines, line)
		interrupted = append(interrupted, pending)
		if bytes.Contains(line, []byte(`"type": "result"`)) || bytes.Contains(line, []byte(`"type":"result"`)) {
			pending = false
		}
	}
	return lines, interrupted
}

// decodeTranscript runs every stdout line through a Decoder and returns
// the events, stamped with turn numbers that advance after each result.
func decodeTranscript(t *testing.T, path string) []schemas.Event {
	lines, interrupted := transcriptLines(t, path)
	var d Decoder
	var out []schemas.Event
	turn := 1
	for i, l := range lines {
		for _, p := range d.Line(l, interrupted[i]) {
			out = append(out, schemas.Event{Turn: turn, Payload: p})
			if _, ok := p.(schemas.Result); ok {
				turn++
			}
		}
	}
	return out
}

func TestDecoderGolden(t *testing.T) {
	paths, _ := filepath.Glob("testdata/claude-*.jsonl")
	if len(paths) < 4 {
		t.Fatalf("found %d claude transcripts in testdata, want 4", len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var got bytes.Buffer
			for _, ev := range decodeTranscript(t, path) {
				b, err := schemas.Encode(ev)
				if err != nil {
					t.Fatal(err)
				}
				schematest.Event(t, b)
				got.Write(b)
				got.WriteByte('\n')
			}
			golden := strings.TrimSuffix(path, ".jsonl") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("decoded events differ from %s; diff them with -update and review", golden)
			}
		})
	}
}

// kinds summarises events: deltas are marked with a +.
func kinds(evs []schemas.Event) []string {
	var out []string
	for _, ev := range evs {
		k := string(ev.Kind())
		if ev.IsDelta() {
			k += "+"
		}
		if len(out) > 0 && out[len(out)-1] == k && ev.IsDelta() {
			continue // collapse runs of deltas
		}
		out = append(out, k)
	}
	return out
}

func TestDecoderTurnShapes(t *testing.T) {
	evs := decodeTranscript(t, "testdata/claude-stream-json.jsonl")
	byTurn := map[int][]schemas.Event{}
	for _, ev := range evs {
		byTurn[ev.Turn] = append(byTurn[ev.Turn], ev)
	}
	want := map[int]string{
		// Text streamed then authoritative, a Bash call announced, its input
		// streamed, then authoritative, its result, the final text, the result.
		1: "assistant_text+ assistant_text tool_use tool_input_delta+ tool_use tool_result assistant_text+ assistant_text result",
		// The same with thinking first.
		2: "thought+ thought assistant_text+ assistant_text tool_use tool_input_delta+ tool_use tool_result assistant_text+ assistant_text result",
		3: "assistant_text+ assistant_text result",
	}
	for turn, w := range want {
		if got := strings.Join(kinds(byTurn[turn]), " "); got != w {
			t.Errorf("turn %d:\n got %s\nwant %s", turn, got, w)
		}
	}
	// The two tool_use events of a call share its id; the deltas carry it.
	var ids []string
	for _, ev := range byTurn[1] {
		switch p := ev.Payload.(type) {
		case schemas.ToolUse:
			ids = append(ids, p.Call.ToolCallID)
			if p.Call.Title != "Bash" || p.Call.Kind != schemas.ToolExecute {
				t.Errorf("tool call %+v, want Bash/execute", p.Call)
			}
		case schemas.ToolInputDelta:
			if p.ToolCallID != "toolu_fake000066" {
				t.Errorf("input delta for %q", p.ToolCallID)
			}
		case schemas.ToolResult:
			if *p.Update.Status != schemas.ToolCompleted || p.Update.Content[0].Content.Text != "hi" {
				t.Errorf("tool result %+v", p.Update)
			}
		case schemas.Result:
			if p.StopReason != schemas.StopEndTurn || p.Usage.InputTokens != 777 || p.Usage.OutputTokens != 19 || *p.Usage.CostUSD != 0 {
				t.Errorf("result %+v usage %+v", p, *p.Usage)
			}
		}
	}
	if len(ids) != 2 || ids[0] != ids[1] || ids[0] != "toolu_fake000066" {
		t.Errorf("tool_use ids %v, want the same id twice", ids)
	}
	// The deltas of a block concatenate to its authoritative copy.
	var streamed strings.Builder
	for _, ev := range byTurn[3] {
		if p, ok := ev.Payload.(schemas.AssistantText); ok {
			if p.Delta {
				streamed.WriteString(p.Content.Text)
			} else if p.Content.Text != streamed.String() {
				t.Errorf("deltas %q, authoritative %q", streamed.String(), p.Content.Text)
			}
		}
	}
}

func TestDecoderInterrupt(t *testing.T) {
	evs := decodeTranscript(t, "testdata/claude-interrupt.annotated.jsonl")
	var results []schemas.Result
	for _, ev := range evs {
		switch p := ev.Payload.(type) {
		case schemas.Result:
			results = append(results, p)
		case schemas.Error:
			t.Errorf("an interrupted turn reported an error: %s", p.Message)
		}
	}
	if len(results) != 2 || results[0].StopReason != schemas.StopCancelled || results[1].StopReason != schemas.StopEndTurn {
		t.Fatalf("results %+v, want cancelled then end_turn", results)
	}
}

func TestDecoderResults(t *testing.T) {
	var d Decoder
	// An API error: is_error with exit code 1 and the text in result.
	out := d.Line([]byte(`{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"result":"API Error: 529 overloaded","stop_reason":null,"usage":{"input_tokens":5,"output_tokens":0}}`), false)
	if len(out) != 2 {
		t.Fatalf("got %d events, want error then result", len(out))
	}
	e := out[0].(schemas.Error)
	if e.Message != "API Error: 529 overloaded" || !strings.Contains(string(e.Data), `"subtype":"success"`) || !strings.Contains(string(e.Data), `"is_error":true`) {
		t.Errorf("error %+v data %s", e, e.Data)
	}
	if r := out[1].(schemas.Result); r.StopReason != schemas.StopRefusal || r.Usage.InputTokens != 5 {
		t.Errorf("result %+v", r)
	}
	// No text: the subtype is the message.
	out = d.Line([]byte(`{"type":"result","subtype":"error_max_turns","is_error":true}`), false)
	if e := out[0].(schemas.Error); e.Message != "error_max_turns" {
		t.Errorf("message %q", e.Message)
	}
	// Interrupted: no error, cancelled.
	out = d.Line([]byte(`{"type":"result","subtype":"error_during_execution","is_error":true,"usage":{"input_tokens":0,"output_tokens":0}}`), true)
	if len(out) != 1 || out[0].(schemas.Result).StopReason != schemas.StopCancelled {
		t.Errorf("interrupted result %+v", out)
	}
	// A stop reason the CLI names is kept; an unknown one falls back.
	out = d.Line([]byte(`{"type":"result","subtype":"success","is_error":false,"stop_reason":"max_tokens"}`), false)
	if r := out[0].(schemas.Result); r.StopReason != schemas.StopMaxTokens || *r.Usage.CostUSD != 0 {
		t.Errorf("result %+v", r)
	}
	out = d.Line([]byte(`{"type":"result","subtype":"success","stop_reason":"cancelled"}`), false)
	if r := out[0].(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("result %+v", r)
	}
}

func TestDecoderOddLines(t *testing.T) {
	var d Decoder
	cases := []struct {
		line string
		want string // "" for no event, else the error message prefix
	}{
		{`not json at all`, "stream-json parse error"},
		{`{"no_type":1}`, "stream-json parse error"},
		{`{"type":"telepathy","x":1}`, "unmapped claude stream-json event: telepathy"},
		{`{"type":"system","subtype":"init","session_id":"s-1"}`, ""},
		{`{"type":"system","subtype":"api_retry","attempt":1}`, ""},
		{`{"type":"control_response","response":{"subtype":"success","request_id":"int-1"}}`, ""},
		{`{"type":"control_response","response":{"subtype":"error","request_id":"int-2","error":"no turn"}}`, "control request failed: no turn"},
		{`{"type":"control_response","response":{"subtype":"error","request_id":"int-3"}}`, "control request failed: unknown"},
		{`{"type":"assistant","message":{"content":[{"type":"hologram"}]}}`, "unmapped claude content block: hologram"},
		{`{"type":"user","message":{"content":[{"type":"text","text":"[Request interrupted by user]"}]}}`, ""},
		{`{"type":"user","message":{"content":"plain"}}`, ""},
		{`   `, ""},
	}
	for _, c := range cases {
		out := d.Line([]byte(c.line), false)
		switch {
		case c.want == "" && len(out) != 0:
			t.Errorf("%s: got %+v, want nothing", c.line, out)
		case c.want != "":
			if len(out) != 1 {
				t.Errorf("%s: got %d events", c.line, len(out))
				continue
			}
			e, ok := out[0].(schemas.Error)
			if !ok || !strings.HasPrefix(e.Message, c.want) {
				t.Errorf("%s: got %+v, want error %q", c.line, out[0], c.want)
			}
			if strings.Contains(c.want, "parse error") || strings.Contains(c.want, "unmapped") {
				var raw string
				if json.Unmarshal(e.Data, &raw) != nil || raw != strings.TrimSpace(c.line) {
					t.Errorf("%s: data %s does not carry the raw line", c.line, e.Data)
				}
			}
		}
	}
	if d.SessionID() != "s-1" {
		t.Errorf("session id %q", d.SessionID())
	}
}

func TestToolResultContent(t *testing.T) {
	var d Decoder
	out := d.Line([]byte(`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"boom"},{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"document"}]}]}}`), false)
	u := out[0].(schemas.ToolResult).Update
	if *u.Status != schemas.ToolFailed || len(u.Content) != 2 {
		t.Fatalf("update %+v", u)
	}
	if c := u.Content[1].Content; c.Type != "image" || c.MimeType != "image/png" || c.Data != "AAAA" {
		t.Errorf("image block %+v", c)
	}
}

func FuzzDecoder(f *testing.F) {
	for _, path := range []string{"testdata/claude-stream-json.jsonl"} {
		b, _ := os.ReadFile(path)
		for _, l := range bytes.Split(b, []byte("\n"))[:40] {
			f.Add(l, false)
		}
	}
	f.Add([]byte(`{"type":"result","is_error":true}`), true)
	f.Fuzz(func(t *testing.T, line []byte, interrupted bool) {
		var d Decoder
		for i, p := range d.Line(line, interrupted) {
			b, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p})
			if err != nil {
				t.Fatalf("event %d of %q does not encode: %v", i, line, err)
			}
			if err := schematest.ValidateEvent(b); err != nil {
				t.Fatalf("event %d of %q is invalid: %v\n%s", i, line, err, b)
			}
		}
	})
}
