package claude

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// transcriptLines returns a transcript's stdout lines, and for each
// whether an interrupt had been requested and not yet answered by a
// result when it was read.
func transcriptLines(t testing.TB, path string) (lines [][]byte, interrupted []bool) {
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

// FuzzDecoder feeds a stream of stdout lines to one Decoder, as a session
// does, so the state a decoder carries from line to line (which content
// block index is which tool call, the session id) is fuzzed along with
// each line. Bit i%64 of interrupts says whether an interrupt was pending
// when line i was read. Whatever the stream, the decoder does not panic,
// every event it yields is a valid envelope, and a streamed tool input
// fragment names the tool call its content block index was started with
// in the same message (the CLI numbers blocks per message), or none.
func FuzzDecoder(f *testing.F) {
	paths, _ := filepath.Glob("testdata/claude-*.jsonl")
	if len(paths) < 4 {
		f.Fatalf("found %d claude transcripts in testdata, want 4", len(paths))
	}
	for _, path := range paths {
		lines, interrupted := transcriptLines(f, path)
		// Overlapping windows of each transcript: streams that cross lines
		// and stay short enough to mutate quickly. (The golden tests decode
		// each whole transcript through one decoder.)
		const window = 8
		for i := 0; i < len(lines); i += window / 2 {
			j := min(i+window, len(lines))
			var mask uint64
			for k, on := range interrupted[i:j] {
				if on {
					mask |= 1 << (k % 64)
				}
			}
			f.Add(bytes.Join(lines[i:j], []byte("\n")), mask)
		}
	}
	// Two messages reusing block index 1 for different tool calls, and a
	// fragment for a block no message started.
	f.Add([]byte(`{"type":"stream_event","event":{"type":"message_start"}}
{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"a","name":"Bash"}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}}
{"type":"stream_event","event":{"type":"message_start"}}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}}
{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"b","name":"Read"}}}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"}"}}}
{"type":"result","is_error":true}
{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"x"}}}`), uint64(1<<7))
	f.Fuzz(func(t *testing.T, stream []byte, interrupts uint64) {
		var d Decoder
		blocks := map[int]string{} // tool calls started in the current message, by block index
		for i, raw := range bytes.Split(stream, []byte("\n")) {
			out := d.Line(raw, interrupts>>(i%64)&1 == 1)
			for j, p := range out {
				b, err := schemas.Encode(schemas.Event{Turn: 1, Payload: p})
				if err != nil {
					t.Fatalf("line %d, event %d (%q) does not encode: %v", i, j, raw, err)
				}
				if err := schematest.ValidateEvent(b); err != nil {
					t.Fatalf("line %d, event %d (%q) is invalid: %v\n%s", i, j, raw, err, b)
				}
			}
			if e, ok := firstError(out); ok && e.Message == "stream-json parse error" {
				continue // the decoder could not read the line, so it changed nothing
			}
			var l struct {
				Type  string `json:"type"`
				Event struct {
					Type         string `json:"type"`
					Index        int    `json:"index"`
					ContentBlock struct {
						Type string `json:"type"`
						ID   string `json:"id"`
					} `json:"content_block"`
				} `json:"event"`
			}
			json.Unmarshal(bytes.TrimSpace(raw), &l)
			switch {
			case l.Type == "result", l.Type == "stream_event" && l.Event.Type == "message_start":
				clear(blocks)
			case l.Type == "stream_event" && l.Event.Type == "content_block_start" && l.Event.ContentBlock.Type == "tool_use":
				blocks[l.Event.Index] = l.Event.ContentBlock.ID
			}
			for _, p := range out {
				if delta, ok := p.(schemas.ToolInputDelta); ok && delta.ToolCallID != blocks[l.Event.Index] {
					t.Fatalf("line %d (%q): a fragment for tool call %q, but block %d of this message is %q",
						i, raw, delta.ToolCallID, l.Event.Index, blocks[l.Event.Index])
				}
			}
		}
	})
}

func firstError(ps []schemas.Payload) (schemas.Error, bool) {
	for _, p := range ps {
		if e, ok := p.(schemas.Error); ok {
			return e, true
		}
	}
	return schemas.Error{}, false
}

// The fast path for streamed deltas yields exactly what the full decoder
// yields for every line it takes, and leaves the rest to it: keys in any
// order, escapes, bytes that are not UTF-8, keys that differ only in case,
// repeated keys, nulls and numbers encoding/json would refuse.
func FuzzFastDeltaAgreesWithTheFullDecoder(f *testing.F) {
	paths, _ := filepath.Glob("testdata/claude-*.jsonl")
	for _, path := range paths {
		lines, _ := transcriptLines(f, path)
		for _, l := range lines {
			f.Add(l)
		}
	}
	for _, s := range []string{
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"plain"}}}`,
		`{"type":"stream_event","event":{"delta":{"text":"I'll ","type":"text_delta"},"index":0,"type":"content_block_delta"},"session_id":"s","parent_tool_use_id":null,"uuid":"u"}`,
		` {"type" : "stream_event" , "event" : { "delta" : { "type" : "thinking_delta" , "thinking" : "hm\n\u00e9\ud83d\ude00" } , "index" : 3 , "type" : "content_block_delta" } } `,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"bad \xff\xfe utf8"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lone \ud800 surrogate"}}}`,
		`{"type":"stream_event","Event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"case"}}}`,
		`{"TYPE":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"case"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"},"delta":{"text":"b"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":null}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1.5,"delta":{"type":"text_delta","text":"x"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1e1,"delta":{"type":"text_delta","text":"x"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"x"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}}trailing`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tab	inside"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"parent_tool_use_id":"toolu_1"}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"uuid":7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var d Decoder
		d.toolIDs = map[int]string{0: "toolu_0", 1: "toolu_1", 3: "toolu_3"}
		raw = bytes.TrimSpace(raw)
		p, ok := d.fastDelta(raw)
		full := d.decodeLine(raw, false)
		if ok && (len(full) != 1 || !reflect.DeepEqual(full[0], p)) {
			t.Fatalf("%q: the fast path gives %#v, the full decoder %#v", raw, p, full)
		}
	})
}

// The fast path takes the deltas the CLI prints, in the CLI's own key
// order: the lines a turn is mostly made of.
func TestFastDeltaTakesTheCLIsDeltas(t *testing.T) {
	lines, _ := transcriptLines(t, "testdata/claude-stream-json.jsonl")
	var d Decoder
	taken, deltas := 0, 0
	for _, l := range lines {
		if bytes.Contains(l, []byte(`"content_block_delta"`)) && !bytes.Contains(l, []byte(`"signature_delta"`)) {
			deltas++
			if _, ok := d.fastDelta(bytes.TrimSpace(l)); ok {
				taken++
			}
		}
		d.Line(l, false)
	}
	if deltas == 0 || taken != deltas {
		t.Errorf("the fast path took %d of the transcript's %d deltas", taken, deltas)
	}
}

func BenchmarkDecodeDelta(b *testing.B) {
	line := []byte(`{"type":"stream_event","event":{"delta":{"text":"use a","type":"text_delta"},"index":0,"type":"content_block_delta"},"session_id":"24687aed-e65b-4de2-a9ef-844300d31851","parent_tool_use_id":null,"uuid":"f59be7d5-4e9c-423b-a19f-7acc491a8fc6"}`)
	for _, path := range []string{"fast", "full"} {
		b.Run(path, func(b *testing.B) {
			var d Decoder
			b.ReportAllocs()
			for b.Loop() {
				if path == "fast" {
					d.Line(line, false)
				} else {
					d.decodeLine(line, false)
				}
			}
		})
	}
}
