package acp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// The -update flag rewrites the golden files. It is registered only if no
// other test file of the package has registered it first.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata")
	}
}

func mapperUpdateGolden() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// mapperTranscripts are real ACP sessions captured from the three agents,
// in testdata: 6 prompts each, the fourth cancelled.
var mapperTranscripts = []string{"acp-opencode", "acp-claude", "acp-gemini"}

// mapperRun is what one transcript yields through one mapper.
type mapperRun struct {
	m        *mapper
	events   []schemas.Event // every payload, stamped with the prompt count
	updates  map[string]int  // sessionUpdate kind → how many the agent sent
	raws     []json.RawMessage
	text     []string // each prompt's assistant text, taken when its response came
	thought  []string
	retired  []schemas.Payload // what retire("cancelled") gave right after session/cancel
	canceled bool
}

// mapperLine is one transcript line and the JSON-RPC message it holds.
type mapperLine struct {
	Dir string `json:"dir"`
	Msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Update json.RawMessage `json:"update"`
		} `json:"params"`
	} `json:"msg"`
}

func mapperReadTranscript(t testing.TB, name string) []mapperLine {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden-"+name+".jsonl"))
	if err != nil {
		t.Fatalf("open transcript: %v", err)
	}
	defer f.Close()
	var lines []mapperLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l mapperLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return lines
}

// mapperReplay feeds the first n lines of a transcript (all when n < 0)
// through one mapper the way a session would: the buffers are cleared at
// each prompt and taken at its response, and open calls are retired at
// the cancel.
func mapperReplay(t testing.TB, name string, n int) *mapperRun {
	t.Helper()
	lines := mapperReadTranscript(t, name)
	if n >= 0 {
		lines = lines[:n]
	}
	r := &mapperRun{m: newMapper(), updates: map[string]int{}}
	prompts := map[string]bool{}
	turn := 0
	for _, l := range lines {
		switch {
		case l.Dir == "client->agent" && l.Msg.Method == "session/prompt":
			turn++
			prompts[string(l.Msg.ID)] = true
			r.m.clearTurnText()
		case l.Dir == "client->agent" && l.Msg.Method == "session/cancel":
			r.canceled = true
			r.retired = r.m.retire("cancelled")
			for _, p := range r.retired {
				r.events = append(r.events, schemas.Event{Turn: turn, Payload: p})
			}
		case l.Dir == "agent->client" && l.Msg.Method == "session/update":
			var head struct {
				SessionUpdate string `json:"sessionUpdate"`
			}
			if err := json.Unmarshal(l.Msg.Params.Update, &head); err != nil {
				t.Fatalf("%s: update %s: %v", name, l.Msg.Params.Update, err)
			}
			r.updates[head.SessionUpdate]++
			r.raws = append(r.raws, l.Msg.Params.Update)
			for _, p := range r.m.update(l.Msg.Params.Update) {
				r.events = append(r.events, schemas.Event{Turn: turn, Payload: p})
			}
		case l.Dir == "agent->client" && l.Msg.Method == "" && prompts[string(l.Msg.ID)]:
			thought, text := r.m.takeTurnText()
			r.thought = append(r.thought, thought)
			r.text = append(r.text, text)
		}
	}
	return r
}

// mapperEncode encodes an event and checks it against the JSON Schemas
// and the Go decoder.
func mapperEncode(t testing.TB, ev schemas.Event) []byte {
	t.Helper()
	b, err := schemas.Encode(ev)
	if err != nil {
		t.Fatalf("encode %#v: %v", ev, err)
	}
	schematest.Event(t, b)
	return b
}

func TestMapperGolden(t *testing.T) {
	for _, name := range mapperTranscripts {
		t.Run(name, func(t *testing.T) {
			r := mapperReplay(t, name, -1)
			if len(r.events) == 0 {
				t.Fatal("the transcript yielded no events")
			}
			var got bytes.Buffer
			for _, ev := range r.events {
				got.Write(mapperEncode(t, ev))
				got.WriteByte('\n')
			}
			golden := filepath.Join("testdata", "golden-"+name+".out.jsonl")
			if mapperUpdateGolden() {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run Golden -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				gl, wl := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
				for i := range min(len(gl), len(wl)) {
					if gl[i] != wl[i] {
						t.Fatalf("line %d differs from %s:\n got %s\nwant %s", i+1, golden, gl[i], wl[i])
					}
				}
				t.Fatalf("got %d lines, %s has %d", len(gl), golden, len(wl))
			}
		})
	}
}

// mapperCount counts payloads by kind.
func mapperCount(evs []schemas.Event) map[schemas.Kind]int {
	n := map[schemas.Kind]int{}
	for _, ev := range evs {
		n[ev.Kind()]++
	}
	return n
}

func TestMapperGoldenFacts(t *testing.T) {
	for _, name := range mapperTranscripts {
		t.Run(name, func(t *testing.T) {
			r := mapperReplay(t, name, -1)
			n := mapperCount(r.events)
			// One event per update, except the kinds that yield none.
			checks := []struct {
				kind   schemas.Kind
				update string
			}{
				{schemas.KindToolUse, "tool_call"},
				{schemas.KindToolResult, "tool_call_update"},
				{schemas.KindAssistantText, "agent_message_chunk"},
				{schemas.KindThought, "agent_thought_chunk"},
				{schemas.KindUserText, "user_message_chunk"},
				{schemas.KindPlan, "plan"},
			}
			for _, c := range checks {
				if n[c.kind] != r.updates[c.update] {
					t.Errorf("%d %s events for %d %s updates", n[c.kind], c.kind, r.updates[c.update], c.update)
				}
			}
			if r.updates["tool_call"] == 0 || r.updates["agent_message_chunk"] == 0 {
				t.Errorf("updates %v: the transcript lost its tool calls or text", r.updates)
			}
			for _, ev := range r.events {
				if e, ok := ev.Payload.(schemas.Error); ok {
					t.Errorf("error event %q data %s", e.Message, e.Data)
				}
			}
			// The deltas of each turn concatenate to what the buffer replays.
			if len(r.text) != 6 {
				t.Fatalf("%d prompt responses, want 6", len(r.text))
			}
			streamed := make([]string, 6)
			for _, ev := range r.events {
				if p, ok := ev.Payload.(schemas.AssistantText); ok {
					if !p.Delta || p.Content.Type != schemas.ContentText {
						t.Errorf("assistant_text %+v, want a text delta", p)
					}
					streamed[ev.Turn-1] += p.Content.Text
				}
			}
			if !slices.Equal(streamed, r.text) {
				t.Errorf("streamed text %q, replayed %q", streamed, r.text)
			}
			// Every call is over before the cancel, so neither retire has work.
			if !r.canceled || len(r.retired) != 0 {
				t.Errorf("retire at the cancel gave %v", r.retired)
			}
			if out := r.m.retire("agent exited"); len(out) != 0 || len(r.m.open) != 0 {
				t.Errorf("calls still open at the end: %v", out)
			}
		})
	}
}

func TestMapperGoldenOpencode(t *testing.T) {
	r := mapperReplay(t, "acp-opencode", -1)
	wantText := []string{
		"tool said: hi-from-acp",
		"tool said: <path>/tmp/peers/work-oc/hello.txt</path>\n<type>file</type>\n<content>\n1: hello file content\n\n(End of file - total 1 lines)\n</content>",
		"tool said: Wrote file successfully.",
		"tick tick tick tick tick tick tick ",
		"pong from fake model. You said: after cancel #0, say hi",
		"pong from fake model. You said: after cancel #1, say hi",
	}
	if !slices.Equal(r.text, wantText) {
		t.Errorf("turn text\n got %q\nwant %q", r.text, wantText)
	}
	if want := []string{"Let me think about this fake problem.", "", "", "", "", ""}; !slices.Equal(r.thought, want) {
		t.Errorf("turn thought %q, want %q", r.thought, want)
	}
	if c := r.m.cost(); c == nil || *c != 0 {
		t.Errorf("cost %v, want 0 (opencode reports a zero cost, not none)", c)
	}
	paths := map[string][]string{
		"call_fake000002": {"/tmp/scratch/work-oc"}, // rawInput cwd, and the location
		"call_fake000004": {"/tmp/scratch/work-oc/hello.txt"},
		"call_fake000006": {"/tmp/scratch/work-oc/acp-written.txt"},
	}
	for id, want := range paths {
		if got := r.m.paths(id); !slices.Equal(got, want) {
			t.Errorf("paths(%s) = %q, want %q", id, got, want)
		}
	}
	// tool_call has no content key: tool_use still carries every key.
	first := string(mapperEncode(t, mapperFirst[schemas.ToolUse](t, r.events)))
	want := `{"kind":"tool_use","turn":1,"data":{"call":{"toolCallId":"call_fake000002","title":"bash","kind":"execute","status":"pending","content":[],"locations":[{"path":"/tmp/scratch/work-oc","line":null}],"rawInput":{"cwd":"/tmp/scratch/work-oc"},"rawOutput":null}}}`
	if first != want {
		t.Errorf("first tool_use\n got %s\nwant %s", first, want)
	}
}

func TestMapperGoldenClaude(t *testing.T) {
	r := mapperReplay(t, "acp-claude", -1)
	if c := r.m.cost(); c == nil || *c != 0.010143000000000001 {
		t.Errorf("cost %v, want the last usage_update's 0.010143000000000001", c)
	}
	if got := r.m.paths("toolu_fake000004"); !slices.Equal(got, []string{"/tmp/scratch/work/hello.txt"}) {
		t.Errorf("Read paths %q", got)
	}
	if got := r.m.paths("toolu_fake000002"); got != nil {
		t.Errorf("Bash paths %q: a shell command is never parsed", got)
	}
	var results []string
	var diff *schemas.ToolCallContent
	for _, ev := range r.events {
		if p, ok := ev.Payload.(schemas.ToolResult); ok && p.Update.ToolCallID == "toolu_fake000002" {
			b, _ := json.Marshal(ev.Payload)
			results = append(results, string(b))
		}
		if p, ok := ev.Payload.(schemas.ToolResult); ok && p.Update.ToolCallID == "toolu_fake000006" && len(p.Update.Content) > 0 && diff == nil {
			diff = &p.Update.Content[0]
		}
	}
	// The input refresh, the _meta-only toolResponse, then the completion:
	// each carries only what its update had.
	want := []string{
		`{"update":{"toolCallId":"toolu_fake000002","title":"echo hi-from-acp","kind":"execute","content":[{"type":"content","content":{"type":"text","text":"run a command for the test"}}],"rawInput":{"command":"echo hi-from-acp","description":"run a command for the test"}}}`,
		`{"update":{"toolCallId":"toolu_fake000002"}}`,
		"{\"update\":{\"toolCallId\":\"toolu_fake000002\",\"status\":\"completed\",\"content\":[{\"type\":\"content\",\"content\":{\"type\":\"text\",\"text\":\"```console\\nhi-from-acp\\n```\"}}],\"rawOutput\":\"hi-from-acp\"}}",
	}
	if !slices.Equal(results, want) {
		t.Errorf("Bash tool results\n got %q\nwant %q", results, want)
	}
	if diff == nil || diff.Type != schemas.ToolContentDiff || diff.OldText != nil || diff.NewText != "hello from fake\n" || diff.Path != "/tmp/scratch/work/acp-written.txt" {
		t.Errorf("Write diff %+v, want a new file (oldText null)", diff)
	}
}

func TestMapperGoldenGemini(t *testing.T) {
	r := mapperReplay(t, "acp-gemini", -1)
	if c := r.m.cost(); c != nil {
		t.Errorf("cost %v: gemini sends no usage_update", *c)
	}
	// gemini announces its write only in the permission request; the
	// completion arrives as an update for a call never opened.
	const write = "write_file__write_file_1795977877155_0"
	var diff *schemas.ToolCallContent
	for _, ev := range r.events {
		switch p := ev.Payload.(type) {
		case schemas.ToolUse:
			if p.Call.ToolCallID == write {
				t.Errorf("a tool_use for %s, which gemini never sent", write)
			}
		case schemas.ToolResult:
			if p.Update.ToolCallID == write {
				diff = &p.Update.Content[0]
			}
		}
	}
	if diff == nil || diff.Type != schemas.ToolContentDiff || diff.OldText == nil || *diff.OldText != "" {
		t.Errorf("write diff %+v, want oldText kept as the empty string", diff)
	}
	if got := r.m.paths(write); !slices.Equal(got, []string{"/tmp/scratch/work-gm/acp-written.txt"}) {
		t.Errorf("write paths %q", got)
	}
}

// mapperFirst returns the first event whose payload is a P.
func mapperFirst[P schemas.Payload](t *testing.T, evs []schemas.Event) schemas.Event {
	t.Helper()
	for _, ev := range evs {
		if _, ok := ev.Payload.(P); ok {
			return ev
		}
	}
	var p P
	t.Fatalf("no %T event", p)
	return schemas.Event{}
}

func TestMapperGoldenRetireMidCall(t *testing.T) {
	// Stop the opencode transcript just before the bash call completes.
	lines := mapperReadTranscript(t, "acp-opencode")
	cut := slices.IndexFunc(lines, func(l mapperLine) bool {
		return bytes.Contains(l.Msg.Params.Update, []byte(`"status": "completed"`))
	})
	if cut < 0 {
		t.Fatal("no completed update in the transcript")
	}
	r := mapperReplay(t, "acp-opencode", cut)
	out := r.m.retire("agent exited")
	if len(out) != 1 {
		t.Fatalf("retire gave %d payloads, want one for the running bash call", len(out))
	}
	got := string(mapperEncode(t, schemas.Event{Turn: 1, Payload: out[0]}))
	want := `{"kind":"tool_result","turn":1,"data":{"update":{"toolCallId":"call_fake000002","status":"failed","content":[{"type":"content","content":{"type":"text","text":"agent exited"}}]}}}`
	if got != want {
		t.Errorf("retired\n got %s\nwant %s", got, want)
	}
	if out := r.m.retire("cancelled"); len(out) != 0 {
		t.Errorf("a second retire gave %v", out)
	}
}

// mapperFeed sends updates written as JSON text through m.
func mapperFeed(t *testing.T, m *mapper, updates ...string) []schemas.Payload {
	t.Helper()
	var out []schemas.Payload
	for _, u := range updates {
		out = append(out, m.update(json.RawMessage(u))...)
	}
	for _, p := range out {
		mapperEncode(t, schemas.Event{Turn: 1, Payload: p})
	}
	return out
}

// mapperData encodes a payload's data alone.
func mapperData(t *testing.T, p schemas.Payload) string {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMapperChunks(t *testing.T) {
	m := newMapper()
	cases := []struct {
		update, want string
		kind         schemas.Kind
	}{
		{`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}`,
			`{"delta":true,"content":{"type":"text","text":"hi"}}`, schemas.KindAssistantText},
		{`{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"hm"},"messageId":"m1"}`,
			`{"delta":true,"content":{"type":"text","text":"hm"}}`, schemas.KindThought},
		{`{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"do it"}}`,
			`{"content":{"type":"text","text":"do it"}}`, schemas.KindUserText},
		{`{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"AAAA","mimeType":"image/png"}}`,
			`{"delta":true,"content":{"type":"image","data":"AAAA","mimeType":"image/png","uri":null}}`, schemas.KindAssistantText},
		{`{"sessionUpdate":"agent_message_chunk","content":{"type":"resource_link","uri":"file:///a","name":"a"}}`,
			`{"delta":true,"content":{"type":"resource_link","uri":"file:///a","name":"a","mimeType":null}}`, schemas.KindAssistantText},
		// ACP nests an embedded resource; Shoal's block is flat.
		{`{"sessionUpdate":"agent_message_chunk","content":{"type":"resource","resource":{"uri":"file:///b","text":"body","mimeType":"text/plain"}}}`,
			`{"delta":true,"content":{"type":"resource","uri":"file:///b","text":"body","blob":null,"mimeType":"text/plain"}}`, schemas.KindAssistantText},
		// An unknown type, or a known one missing its fields, keeps its JSON as text.
		{`{"sessionUpdate":"agent_message_chunk","content":{"type":"hologram", "depth": 3}}`,
			`{"delta":true,"content":{"type":"text","text":"{\"type\":\"hologram\",\"depth\":3}"}}`, schemas.KindAssistantText},
		{`{"sessionUpdate":"agent_thought_chunk","content":{"type":"text"}}`,
			`{"delta":true,"content":{"type":"text","text":"{\"type\":\"text\"}"}}`, schemas.KindThought},
		{`{"sessionUpdate":"agent_message_chunk","content":"bare"}`,
			`{"delta":true,"content":{"type":"text","text":"\"bare\""}}`, schemas.KindAssistantText},
	}
	for _, c := range cases {
		out := mapperFeed(t, m, c.update)
		if len(out) != 1 || out[0].Kind() != c.kind {
			t.Errorf("%s: got %v, want one %s", c.update, out, c.kind)
			continue
		}
		if got := mapperData(t, out[0]); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.update, got, c.want)
		}
	}
	// Only text blocks reach the replay buffers, unknown ones as their JSON.
	thought, text := m.takeTurnText()
	if thought != `hm{"type":"text"}` || text != `hi{"type":"hologram","depth":3}"bare"` {
		t.Errorf("buffers %q %q", thought, text)
	}
}

func TestMapperTurnText(t *testing.T) {
	m := newMapper()
	chunk := func(kind, s string) string {
		return fmt.Sprintf(`{"sessionUpdate":%q,"content":{"type":"text","text":%q}}`, kind, s)
	}
	mapperFeed(t, m, chunk("agent_thought_chunk", "think "), chunk("agent_message_chunk", "Hel"),
		chunk("agent_thought_chunk", "more"), chunk("agent_message_chunk", "lo"), chunk("user_message_chunk", "not mine"))
	if thought, text := m.takeTurnText(); thought != "think more" || text != "Hello" {
		t.Errorf("takeTurnText = %q, %q", thought, text)
	}
	if thought, text := m.takeTurnText(); thought != "" || text != "" {
		t.Errorf("a second take gave %q, %q, want the buffers cleared", thought, text)
	}
	mapperFeed(t, m, chunk("agent_message_chunk", "stale"), chunk("agent_thought_chunk", "stale"))
	m.clearTurnText()
	mapperFeed(t, m, chunk("agent_message_chunk", "fresh"))
	if thought, text := m.takeTurnText(); thought != "" || text != "fresh" {
		t.Errorf("after clearTurnText: %q, %q", thought, text)
	}
}

func TestMapperToolCalls(t *testing.T) {
	m := newMapper()
	out := mapperFeed(t, m,
		`{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Read a","kind":"read","status":"in_progress",
		  "content":[{"type":"content","content":{"type":"text","text":"x"}}],"locations":[{"path":"/w/a","line":3}],
		  "rawInput":{"path":"/w/a"},"rawOutput":{"n":1},"_meta":{"x":1}}`,
		`{"sessionUpdate":"tool_call","toolCallId":"t2"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"t3","kind":"teleport","status":"warp","rawInput":null}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","rawOutput":"done"}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"t2","title":"","content":[],"locations":[]}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"t2","title":null,"kind":null,"rawInput":null}`,
	)
	want := []string{
		`{"call":{"toolCallId":"t1","title":"Read a","kind":"read","status":"in_progress","content":[{"type":"content","content":{"type":"text","text":"x"}}],"locations":[{"path":"/w/a","line":3}],"rawInput":{"path":"/w/a"},"rawOutput":{"n":1}}}`,
		`{"call":{"toolCallId":"t2","title":"","kind":"other","status":"pending","content":[],"locations":[],"rawInput":null,"rawOutput":null}}`,
		`{"call":{"toolCallId":"t3","title":"","kind":"other","status":"pending","content":[],"locations":[],"rawInput":null,"rawOutput":null}}`,
		`{"update":{"toolCallId":"t1","status":"completed","rawOutput":"done"}}`,
		// Present but empty is present.
		`{"update":{"toolCallId":"t2","title":"","content":[],"locations":[]}}`,
		// Null is absent.
		`{"update":{"toolCallId":"t2"}}`,
	}
	if len(out) != len(want) {
		t.Fatalf("got %d payloads, want %d", len(out), len(want))
	}
	for i := range want {
		if got := mapperData(t, out[i]); got != want[i] {
			t.Errorf("payload %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
	if !slices.Equal(m.open, []string{"t2", "t3"}) {
		t.Errorf("open calls %v, want t2 and t3", m.open)
	}
}

func TestMapperToolContent(t *testing.T) {
	m := newMapper()
	out := mapperFeed(t, m, `{"sessionUpdate":"tool_call_update","toolCallId":"c","content":[
		{"type":"diff","path":"/w/f","oldText":"a","newText":"b","_meta":{"kind":"edit"}},
		{"type":"diff","path":"/w/g","oldText":null,"newText":"new"},
		{"type":"terminal","terminalId":"term-1"},
		{"type":"content","content":{"type":"text","text":"ok"}},
		{"type":"content","content":{"type":"widget","w":1}},
		{"type":"text","text":"bare block"},
		{"type":"gizmo","content":{"type":"text","text":"inner"}},
		{"type":"gizmo"}
	]}`)
	want := `{"update":{"toolCallId":"c","content":[` +
		`{"type":"diff","path":"/w/f","oldText":"a","newText":"b"},` +
		`{"type":"diff","path":"/w/g","oldText":null,"newText":"new"},` +
		`{"type":"terminal","terminalId":"term-1"},` +
		`{"type":"content","content":{"type":"text","text":"ok"}},` +
		`{"type":"content","content":{"type":"text","text":"{\"type\":\"widget\",\"w\":1}"}},` +
		`{"type":"content","content":{"type":"text","text":"bare block"}},` +
		`{"type":"content","content":{"type":"text","text":"inner"}},` +
		`{"type":"content","content":{"type":"text","text":"{\"type\":\"gizmo\"}"}}]}}`
	if len(out) != 1 {
		t.Fatalf("got %v", out)
	}
	if got := mapperData(t, out[0]); got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

func TestMapperPlan(t *testing.T) {
	out := mapperFeed(t, newMapper(),
		`{"sessionUpdate":"plan","entries":[{"content":"read","priority":"high","status":"completed"},{"content":"write","priority":"urgent","status":"blocked"}]}`,
		`{"sessionUpdate":"plan"}`)
	want := []string{
		`{"entries":[{"content":"read","priority":"high","status":"completed"},{"content":"write","priority":"medium","status":"pending"}]}`,
		`{"entries":[]}`,
	}
	if len(out) != 2 {
		t.Fatalf("got %v", out)
	}
	for i := range want {
		if got := mapperData(t, out[i]); got != want[i] {
			t.Errorf("plan %d: got %s, want %s", i, got, want[i])
		}
	}
}

func TestMapperRetire(t *testing.T) {
	m := newMapper()
	if out := m.retire("cancelled"); len(out) != 0 {
		t.Fatalf("retire with nothing open gave %v", out)
	}
	mapperFeed(t, m,
		`{"sessionUpdate":"tool_call","toolCallId":"c","status":"pending"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"a","status":"in_progress"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"done","status":"completed"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"b"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"c","status":"in_progress"}`, // a re-announce keeps its place
		`{"sessionUpdate":"tool_call_update","toolCallId":"a","status":"in_progress"}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"x","status":"failed"}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"b","status":"failed"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"d","status":"in_progress"}`,
	)
	out := m.retire("cancelled")
	var got []string
	for _, p := range out {
		got = append(got, mapperData(t, p))
	}
	want := []string{
		`{"update":{"toolCallId":"c","status":"failed","content":[{"type":"content","content":{"type":"text","text":"cancelled"}}]}}`,
		`{"update":{"toolCallId":"a","status":"failed","content":[{"type":"content","content":{"type":"text","text":"cancelled"}}]}}`,
		`{"update":{"toolCallId":"d","status":"failed","content":[{"type":"content","content":{"type":"text","text":"cancelled"}}]}}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("retired\n got %q\nwant %q", got, want)
	}
	if out := m.retire("agent exited"); len(out) != 0 {
		t.Errorf("retired calls came back: %v", out)
	}
	// A call opened after a retire is tracked afresh.
	mapperFeed(t, m, `{"sessionUpdate":"tool_call","toolCallId":"e"}`)
	if out := m.retire("agent exited"); len(out) != 1 || out[0].(schemas.ToolResult).Update.Content[0].Content.Text != "agent exited" {
		t.Errorf("retire gave %v", out)
	}
}

func TestMapperPaths(t *testing.T) {
	m := newMapper()
	mapperFeed(t, m,
		`{"sessionUpdate":"tool_call","toolCallId":"p","rawInput":{
			"filePath":"/w/a","file_path":"/w/a","paths":["/w/b","",7,"/w/c"],"file":"/w/d","CWD":"/w","dir":"/w/e",
			"directory":"/w/f","pathological":"/w/g","command":"cat /w/nope","dirs":"/w/nope","filename":"/w/nope","path2":{"x":"/w/nope"},"x_path":""},
		 "locations":[{"path":"/w/h","line":1},{"path":""},{"path":"/w/a"}]}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"p","rawInput":{"path":"/w/i"},"locations":[{"path":"/w/b"},{"path":"/w/j"}]}`,
		`{"sessionUpdate":"tool_call_update","toolCallId":"p","rawInput":"not an object"}`,
		`{"sessionUpdate":"tool_call","toolCallId":"none","rawInput":{"command":"ls /w"}}`,
	)
	// Keys in sorted order, then locations, each path once.
	want := []string{"/w", "/w/e", "/w/f", "/w/d", "/w/a", "/w/g", "/w/b", "/w/c", "/w/h", "/w/i", "/w/j"}
	if got := m.paths("p"); !slices.Equal(got, want) {
		t.Errorf("paths\n got %q\nwant %q", got, want)
	}
	if got := m.paths("none"); got != nil {
		t.Errorf("paths of a call with none: %q", got)
	}
	if got := m.paths("unknown"); got != nil {
		t.Errorf("paths of an unknown call: %q", got)
	}
	// The caller gets a copy.
	m.paths("p")[0] = "/etc"
	if got := m.paths("p"); got[0] != "/w" {
		t.Errorf("paths shares its slice: %q", got)
	}
}

func TestMapperPathsEviction(t *testing.T) {
	m := newMapper()
	call := func(i int) string {
		return fmt.Sprintf(`{"sessionUpdate":"tool_call","toolCallId":"id-%d","locations":[{"path":"/w/%d"}]}`, i, i)
	}
	for i := range maxRememberedCalls {
		m.update(json.RawMessage(call(i)))
	}
	// Updating a remembered call does not make it younger.
	m.update(json.RawMessage(`{"sessionUpdate":"tool_call_update","toolCallId":"id-0","rawInput":{"path":"/w/more"}}`))
	if got := m.paths("id-0"); !slices.Equal(got, []string{"/w/0", "/w/more"}) {
		t.Fatalf("paths(id-0) = %q before eviction", got)
	}
	m.update(json.RawMessage(call(maxRememberedCalls)))
	if got := m.paths("id-0"); got != nil {
		t.Errorf("id-0 still has %q after %d newer calls", got, maxRememberedCalls)
	}
	for _, i := range []int{1, maxRememberedCalls - 1, maxRememberedCalls} {
		if got := m.paths(fmt.Sprintf("id-%d", i)); !slices.Equal(got, []string{fmt.Sprintf("/w/%d", i)}) {
			t.Errorf("paths(id-%d) = %q", i, got)
		}
	}
	if len(m.callPaths) != maxRememberedCalls || len(m.pathOrder) != maxRememberedCalls {
		t.Errorf("remembering %d ids (%d in order), want %d", len(m.callPaths), len(m.pathOrder), maxRememberedCalls)
	}
}

func TestMapperCost(t *testing.T) {
	m := newMapper()
	if c := m.cost(); c != nil {
		t.Fatalf("cost %v before any usage_update", *c)
	}
	steps := []struct {
		update string
		want   *float64
	}{
		{`{"sessionUpdate":"usage_update","used":10,"size":100}`, nil},
		{`{"sessionUpdate":"usage_update","used":10,"size":100,"cost":null}`, nil},
		{`{"sessionUpdate":"usage_update","cost":{"amount":0.25,"currency":"USD"}}`, schemas.Cost(0.25)},
		{`{"sessionUpdate":"usage_update","cost":{"currency":"USD"}}`, schemas.Cost(0.25)},
		{`{"sessionUpdate":"usage_update"}`, schemas.Cost(0.25)},
		{`{"sessionUpdate":"usage_update","cost":{"amount":0}}`, schemas.Cost(0)},
		{`{"sessionUpdate":"usage_update","cost":{"amount":1.5}}`, schemas.Cost(1.5)},
	}
	for _, s := range steps {
		if out := mapperFeed(t, m, s.update); len(out) != 0 {
			t.Errorf("%s gave %v, want no payload", s.update, out)
		}
		got := m.cost()
		if (got == nil) != (s.want == nil) || (got != nil && *got != *s.want) {
			t.Errorf("after %s: cost %v, want %v", s.update, got, s.want)
		}
	}
	// The caller gets a copy.
	*m.cost() = 99
	if c := m.cost(); *c != 1.5 {
		t.Errorf("cost shares its value: %v", *c)
	}
	// A cost that is not a number is reported, and the last one kept.
	out := mapperFeed(t, m, `{"sessionUpdate":"usage_update","cost":{"amount":"lots"}}`)
	if len(out) != 1 || out[0].Kind() != schemas.KindError || *m.cost() != 1.5 {
		t.Errorf("bad cost gave %v, cost %v", out, *m.cost())
	}
}

// ACP's usage_update reports the session's cost so far (claude-agent-acp
// 0.002397, 0.005226, 0.007737 after three turns of acp-claude.jsonl);
// each turn's usage carries the turn's own share, so the turns add up to
// the session's total, and a turn with no usage_update cost nothing.
func TestMapperTurnCost(t *testing.T) {
	m := newMapper()
	if c := m.takeTurnCost(); c != nil {
		t.Fatalf("turn cost %v before any usage_update", *c)
	}
	usage := func(amount float64) {
		t.Helper()
		mapperFeed(t, m, fmt.Sprintf(`{"sessionUpdate":"usage_update","used":336,"size":200000,"cost":{"amount":%v,"currency":"USD"}}`, amount))
	}
	turn := func(want float64) {
		t.Helper()
		c := m.takeTurnCost()
		if c == nil || math.Abs(*c-want) > 1e-12 {
			t.Fatalf("turn cost %v, want %v", c, want)
		}
	}
	usage(0.002397)
	turn(0.002397)
	usage(0.005226)
	turn(0.005226 - 0.002397)
	usage(0.007737)
	turn(0.007737 - 0.005226)
	turn(0) // a cancelled turn, no usage_update
	// A total that went down is a count begun again: all of it is new.
	usage(0.001)
	turn(0.001)
	usage(0.009)
	turn(0.008)

	// A session replaced after an interrupt: what the old one cost since
	// its last turn goes with the next turn, and the new one counts from
	// nothing.
	usage(0.010)
	m.newSession()
	usage(0.0005)
	turn(0.010 - 0.009 + 0.0005)
	m.newSession()
	if c := m.takeTurnCost(); c != nil {
		t.Fatalf("turn cost %v of a fresh session that has reported none", *c)
	}
}

func TestMapperIgnoredAndUnknown(t *testing.T) {
	m := newMapper()
	for _, u := range []string{
		`{"sessionUpdate":"current_mode_update","currentModeId":"plan"}`,
		`{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"init"}]}`,
		`{"sessionUpdate":"config_option_update","configOptions":[]}`,
		`{"sessionUpdate":"session_info_update","title":"x"}`,
	} {
		if out := mapperFeed(t, m, u); len(out) != 0 {
			t.Errorf("%s gave %v, want nothing", u, out)
		}
	}
	for _, c := range []struct{ update, kind string }{
		{`{"sessionUpdate":"session_mood_update", "mood": "x"}`, "session_mood_update"},
		{`{"sessionUpdate":""}`, ""},
		{`{"sessionUpdate":"Agent_Message_Chunk","content":{"type":"text","text":"hi"}}`, "Agent_Message_Chunk"},
	} {
		out := mapperFeed(t, m, c.update)
		if len(out) != 1 {
			t.Fatalf("%s gave %v", c.update, out)
		}
		e, ok := out[0].(schemas.Error)
		if !ok || e.Message != "unmapped session/update: "+c.kind {
			t.Errorf("%s gave %+v", c.update, out[0])
			continue
		}
		var compact bytes.Buffer
		json.Compact(&compact, []byte(c.update))
		if string(e.Data) != compact.String() {
			t.Errorf("data %s, want the update %s", e.Data, compact.String())
		}
	}
}

func TestMapperMalformed(t *testing.T) {
	cases := []struct {
		update  string
		want    string // the message, or its start when mention is set
		mention string // what a message written by encoding/json must name
		data    string // the error's data as JSON
	}{
		{``, "malformed session/update: no update object", "", `""`},
		{`   `, "malformed session/update: no update object", "", `""`},
		{`{"sessionUpdate":"agent_message_chunk",`, "malformed session/update: ", "end of JSON input",
			`"{\"sessionUpdate\":\"agent_message_chunk\","`},
		{`not json`, "malformed session/update: ", "invalid character", `"not json"`},
		{`null`, "malformed session/update: no sessionUpdate", "", `null`},
		{`{}`, "malformed session/update: no sessionUpdate", "", `{}`},
		{`[1,2]`, "malformed session/update: ", "array", `[1,2]`},
		{`{"sessionUpdate":7}`, "malformed session/update: ", "sessionUpdate", `{"sessionUpdate":7}`},
		{`{"sessionUpdate":"agent_message_chunk"}`, "malformed agent_message_chunk: no content", "", `{"sessionUpdate":"agent_message_chunk"}`},
		{`{"sessionUpdate":"user_message_chunk","content":null}`, "malformed user_message_chunk: no content", "", `{"sessionUpdate":"user_message_chunk","content":null}`},
		{`{"sessionUpdate":"tool_call","title":"x"}`, "malformed tool_call: no toolCallId", "", `{"sessionUpdate":"tool_call","title":"x"}`},
		{`{"sessionUpdate":"tool_call_update","toolCallId":"t","status":"completed","content":{"type":"text"}}`,
			"malformed tool_call_update: content is not an array", "",
			`{"sessionUpdate":"tool_call_update","toolCallId":"t","status":"completed","content":{"type":"text"}}`},
		{`{"sessionUpdate":"tool_call","toolCallId":"t","title":5}`,
			"malformed tool_call: ", "title",
			`{"sessionUpdate":"tool_call","toolCallId":"t","title":5}`},
		{`{"sessionUpdate":"tool_call","toolCallId":"t","locations":[{"path":"/a","line":1.5}]}`,
			"malformed tool_call: ", "line",
			`{"sessionUpdate":"tool_call","toolCallId":"t","locations":[{"path":"/a","line":1.5}]}`},
		{`{"sessionUpdate":"plan","entries":{}}`,
			"malformed plan: ", "entries",
			`{"sessionUpdate":"plan","entries":{}}`},
		// Invalid UTF-8 is replaced, so the data stays JSON.
		{"{\"sessionUpdate\":\"odd\xff\"}", "unmapped session/update: odd\uFFFD", "", "{\"sessionUpdate\":\"odd\uFFFD\"}"},
	}
	for _, c := range cases {
		m := newMapper()
		out := mapperFeed(t, m, c.update)
		if len(out) != 1 {
			t.Errorf("%q gave %d payloads, want one error", c.update, len(out))
			continue
		}
		e, ok := out[0].(schemas.Error)
		if !ok {
			t.Errorf("%q gave %+v, want an error", c.update, out[0])
			continue
		}
		if c.mention == "" && e.Message != c.want ||
			c.mention != "" && (!strings.HasPrefix(e.Message, c.want) || !strings.Contains(e.Message, c.mention)) {
			t.Errorf("%q: message\n got %q\nwant %q", c.update, e.Message, c.want)
		}
		var got bytes.Buffer
		json.Compact(&got, e.Data)
		if got.String() != c.data {
			t.Errorf("%q: data %s, want %s", c.update, got.String(), c.data)
		}
		if len(m.open) != 0 {
			t.Errorf("%q opened %v", c.update, m.open)
		}
	}
}

// cost, for the tests, is cost.amount of the most recent usage_update
// that carried one, or nil: the session's cost so far.
func (m *mapper) cost() *float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastCost == nil {
		return nil
	}
	c := *m.lastCost
	return &c
}
