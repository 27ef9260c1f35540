package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// dialectCase is one of the wire formats the dialects are tested against.
type dialectCase struct {
	name  string
	label string // the prefix of the dialect's errors
	mlx   bool   // the fake speaks mlx_lm.server on /v1/chat/completions
	open  func(host string) dialect
	// toolStop is the finish reason after tool calls.
	toolStop string
	// cacheInPrompt: the prompt count includes cached tokens, reported
	// apart (OpenAI, mlx); Ollama reports neither.
	cacheInPrompt bool
}

func dialectCases() []dialectCase {
	ollama := func(host string) dialect { return newOllama(host) }
	openai := func(host string) dialect { return newOpenAI(host) }
	return []dialectCase{
		{name: "Ollama", label: "ollama", open: ollama, toolStop: "stop"},
		{name: "OpenAI", label: "openai", open: openai, toolStop: "tool_calls", cacheInPrompt: true},
		{name: "MLX", label: "openai", mlx: true, open: openai, toolStop: "tool_calls", cacheInPrompt: true},
	}
}

// forEachDialect runs f, in parallel, against a fake model server of each
// dialect.
func forEachDialect(t *testing.T, f func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect)) {
	t.Helper()
	for _, tc := range dialectCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, fakemodel.Config{MLX: tc.mlx})
			f(t, tc, s, tc.open(s.URL()))
		})
	}
}

func dialectCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// collectDeltas runs one round and returns the deltas it delivered.
func collectDeltas(ctx context.Context, d dialect, req chatRequest) ([]delta, error) {
	var out []delta
	err := d.chat(ctx, req, func(x delta) error {
		out = append(out, x)
		return nil
	})
	return out, err
}

func userRound(text string) chatRequest {
	return chatRequest{Model: "fake-model", Messages: []message{{Role: "user", Content: text}}}
}

// describeDeltas renders deltas one a line, for comparisons.
func describeDeltas(ds []delta) []string {
	var out []string
	for _, d := range ds {
		var parts []string
		if d.Thinking != "" {
			parts = append(parts, "thinking "+strconv.Quote(d.Thinking))
		}
		if d.Text != "" {
			parts = append(parts, "text "+strconv.Quote(d.Text))
		}
		if len(d.ToolCalls) > 0 {
			var calls []string
			for _, c := range d.ToolCalls {
				calls = append(calls, fmt.Sprintf("%s %s %s", c.ID, c.Name, c.Arguments))
			}
			parts = append(parts, "tools "+strings.Join(calls, " | "))
		}
		if d.Done {
			s := "done " + d.Stop
			switch u := d.Usage; {
			case u == nil:
				s += " usage=nil"
			case u.CostUSD == nil:
				s += fmt.Sprintf(" in=%d out=%d cache=%d cost=nil", u.InputTokens, u.OutputTokens, u.CacheReadTokens)
			default:
				s += fmt.Sprintf(" in=%d out=%d cache=%d cost=%g", u.InputTokens, u.OutputTokens, u.CacheReadTokens, *u.CostUSD)
			}
			parts = append(parts, s)
		} else if d.Stop != "" || d.Usage != nil {
			parts = append(parts, "stray stop or usage")
		}
		out = append(out, strings.Join(parts, " + "))
	}
	return out
}

// checkDeltaShape fails t unless every delta but the last has exactly one part
// and the last is the only Done.
func checkDeltaShape(t *testing.T, ds []delta) {
	t.Helper()
	if len(ds) == 0 || !ds[len(ds)-1].Done {
		t.Fatalf("the answer has no last delta: %q", describeDeltas(ds))
	}
	for i, line := range describeDeltas(ds) {
		if strings.Contains(line, " + ") || line == "" || strings.Contains(line, "stray") ||
			(i < len(ds)-1) == strings.HasPrefix(line, "done") {
			t.Errorf("delta %d is malformed: %q", i, line)
		}
	}
}

// joinDeltas is the text, thinking and tool calls of ds, the pieces of each
// joined, in the order their kinds first appeared.
func joinDeltas(ds []delta) (order []string, thinking, text string, calls []toolCall) {
	seen := map[string]bool{}
	mark := func(kind string) {
		if !seen[kind] {
			seen[kind] = true
			order = append(order, kind)
		}
	}
	for _, d := range ds {
		switch {
		case d.Thinking != "":
			mark("thinking")
			thinking += d.Thinking
		case d.Text != "":
			mark("text")
			text += d.Text
		case len(d.ToolCalls) > 0:
			mark("tools")
			calls = append(calls, d.ToolCalls...)
		}
	}
	return order, thinking, text, calls
}

func TestDialectStreamsThinkingTextAndToolCalls(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		s.Script(fakemodel.Reply{
			Thinking: "The user wants the weather in Tokyo.",
			Text:     "Let me look that up — one moment.",
			ToolCalls: []fakemodel.ToolCall{
				{ID: "call_weather1", Name: "get_weather", Input: json.RawMessage(`{"city": "Tokyo", "days": 3}`)},
				{Name: "get_time"},
			},
			Usage:     fakemodel.Usage{Input: 40, Output: 12, CacheRead: 4},
			ChunkSize: 5,
		})
		ds, err := collectDeltas(dialectCtx(t), d, userRound("weather in Tokyo?"))
		if err != nil {
			t.Fatal(err)
		}
		checkDeltaShape(t, ds)
		order, thinking, text, calls := joinDeltas(ds)
		if want := []string{"thinking", "text", "tools"}; !reflect.DeepEqual(order, want) {
			t.Errorf("parts came in the order %q, want %q", order, want)
		}
		if thinking != "The user wants the weather in Tokyo." || text != "Let me look that up — one moment." {
			t.Errorf("thinking %q, text %q", thinking, text)
		}
		if first := ds[0].Thinking; first != "The u" {
			t.Errorf("the first delta is %q, not the first piece of thinking as it streamed", first)
		}
		if len(calls) != 2 ||
			calls[0].ID != "call_weather1" || calls[0].Name != "get_weather" || string(calls[0].Arguments) != `{"city":"Tokyo","days":3}` ||
			calls[1].ID == "" || calls[1].Name != "get_time" || string(calls[1].Arguments) != `{}` {
			t.Errorf("tool calls %q", describeDeltas([]delta{{ToolCalls: calls}}))
		}
		want := "done " + tc.toolStop + " in=40 out=12 cache=0 cost=0"
		if tc.cacheInPrompt {
			want = "done " + tc.toolStop + " in=44 out=12 cache=4 cost=0"
		}
		if got := describeDeltas(ds[len(ds)-1:])[0]; got != want {
			t.Errorf("last delta %q, want %q", got, want)
		}
	})
}

func TestDialectTextOnly(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		s.Script(fakemodel.Reply{Text: "hello there", Usage: fakemodel.Usage{Input: 7, Output: 2}})
		ds, err := collectDeltas(dialectCtx(t), d, userRound("hi"))
		if err != nil {
			t.Fatal(err)
		}
		checkDeltaShape(t, ds)
		want := []string{`text "hello th"`, `text "ere"`, "done stop in=7 out=2 cache=0 cost=0"}
		if got := describeDeltas(ds); !reflect.DeepEqual(got, want) {
			t.Errorf("deltas %q, want %q", got, want)
		}
	})
}

func TestOllamaRequest(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	if _, err := collectDeltas(dialectCtx(t), newOllama(s.URL()+"/"), userRound("hi")); err != nil {
		t.Fatal(err)
	}
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.Method != http.MethodPost || r.Path != "/api/chat" || r.Header.Get("Content-Type") != "application/json" ||
		r.Header.Get("Connection") != "close" {
		t.Errorf("request %s %s with headers %v", r.Method, r.Path, r.Header)
	}
	wantSameJSON(t, r.Body, `{
		"model": "fake-model",
		"messages": [{"role": "user", "content": "hi"}],
		"stream": true,
		"options": {"num_ctx": 16384, "temperature": 0}
	}`)
}

func TestOpenAIRequest(t *testing.T) {
	t.Parallel()
	for _, mlx := range []bool{false, true} {
		name := "OpenAI"
		if mlx {
			name = "MLX"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := fakemodel.Start(t, fakemodel.Config{MLX: mlx})
			if _, err := collectDeltas(dialectCtx(t), newOpenAI(s.URL()), userRound("hi")); err != nil {
				t.Fatal(err)
			}
			reqs := s.Requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests", len(reqs))
			}
			r := reqs[0]
			if r.Method != http.MethodPost || r.Path != "/v1/chat/completions" ||
				r.Header.Get("Content-Type") != "application/json" ||
				r.Header.Get("Content-Length") != strconv.Itoa(len(r.Body)) {
				t.Errorf("request %s %s with headers %v and a %d-byte body", r.Method, r.Path, r.Header, len(r.Body))
			}
			wantSameJSON(t, r.Body, `{
				"model": "fake-model",
				"messages": [{"role": "user", "content": "hi"}],
				"stream": true,
				"stream_options": {"include_usage": true}
			}`)
		})
	}
}

// wantSameJSON fails t unless got and want are the same JSON value.
func wantSameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("invalid wanted JSON: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got JSON\n%s\nwant\n%s", got, want)
	}
}

func TestDialectToolResultRound(t *testing.T) {
	t.Parallel()
	wantMessages := map[string]string{
		"Ollama": `[
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": "Weather in Tokyo?"},
			{"role": "assistant", "content": "", "thinking": "I should ask the tool.",
			 "tool_calls": [
				{"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
				{"function": {"name": "get_time", "arguments": {}}}]},
			{"role": "tool", "content": "22°C", "tool_name": "get_weather"},
			{"role": "tool", "content": "09:00", "tool_name": "get_time"}
		]`,
		"OpenAI": `[
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": "Weather in Tokyo?"},
			{"role": "assistant", "content": "",
			 "tool_calls": [
				{"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Tokyo\"}"}},
				{"id": "call_8", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
			{"role": "tool", "content": "22°C", "tool_call_id": "call_7"},
			{"role": "tool", "content": "09:00", "tool_call_id": "call_8"}
		]`,
	}
	wantMessages["MLX"] = wantMessages["OpenAI"]
	const wantTools = `[
		{"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city.",
		 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
		{"type": "function", "function": {"name": "get_time", "description": "",
		 "parameters": {"type": "object", "properties": {}}}}
	]`
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		s.Script(fakemodel.Reply{Text: "It is 22°C at 09:00."})
		req := chatRequest{
			Model: "fake-model",
			Messages: []message{
				{Role: "system", Content: "Be brief."},
				{Role: "user", Content: "Weather in Tokyo?"},
				{Role: "assistant", Thinking: "I should ask the tool.", ToolCalls: []toolCall{
					{ID: "call_7", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Tokyo"}`)},
					{ID: "call_8", Name: "get_time"},
				}},
				{Role: "tool", ToolName: "get_weather", ToolID: "call_7", Content: "22°C"},
				{Role: "tool", ToolName: "get_time", ToolID: "call_8", Content: "09:00"},
			},
			Tools: []toolSpec{
				{Name: "get_weather", Description: "Today's weather in a city.",
					Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
				{Name: "get_time"},
			},
		}
		ds, err := collectDeltas(dialectCtx(t), d, req)
		if err != nil {
			t.Fatal(err)
		}
		checkDeltaShape(t, ds)
		if _, _, text, _ := joinDeltas(ds); text != "It is 22°C at 09:00." {
			t.Errorf("text %q", text)
		}
		reqs := s.Requests()
		if len(reqs) != 1 {
			t.Fatalf("%d requests", len(reqs))
		}
		r := reqs[0]
		if len(r.ToolResults) != 2 || r.ToolResults[0].Name != "get_weather" || r.ToolResults[0].Content != "22°C" ||
			r.ToolResults[1].Name != "get_time" || r.ToolResults[1].Content != "09:00" {
			t.Errorf("the server read the tool results as %+v", r.ToolResults)
		}
		if !reflect.DeepEqual(r.Tools, []string{"get_weather", "get_time"}) {
			t.Errorf("the server read the tools as %q", r.Tools)
		}
		var body struct {
			Messages json.RawMessage `json:"messages"`
			Tools    json.RawMessage `json:"tools"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		wantSameJSON(t, body.Messages, wantMessages[tc.name])
		wantSameJSON(t, body.Tools, wantTools)
	})
}

func TestDialectHTTPError(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		for _, r := range []struct {
			reply fakemodel.Reply
			want  string
		}{
			{fakemodel.Reply{Status: 404, ErrorMessage: `model "nope" not found`}, `model "nope" not found (404)`},
			{fakemodel.Reply{Status: 500, ErrorMessage: "the runner crashed"}, "the runner crashed (500)"},
			{fakemodel.Reply{Status: 503}, "Service Unavailable (503)"},
		} {
			before := len(s.Requests())
			s.Script(r.reply)
			ds, err := collectDeltas(dialectCtx(t), d, userRound("hi"))
			if want := tc.label + ": " + r.want; err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
			if len(ds) != 0 {
				t.Errorf("deltas %q", describeDeltas(ds))
			}
			if n := len(s.Requests()) - before; n != 1 {
				t.Errorf("an HTTP error answer was sent %d times, want once", n)
			}
		}
	})
}

func TestDialectMidStreamError(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		s.Script(fakemodel.Reply{Text: "partial", MidStreamError: "out of memory"})
		ds, err := collectDeltas(dialectCtx(t), d, userRound("hi"))
		if want := tc.label + ": out of memory"; err == nil || err.Error() != want {
			t.Errorf("error %v, want %q", err, want)
		}
		if got := describeDeltas(ds); !reflect.DeepEqual(got, []string{`text "partial"`}) {
			t.Errorf("deltas %q", got)
		}
		if n := len(s.Requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

func TestDialectCancel(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		for _, afterDelta := range []bool{true, false} {
			reply := fakemodel.Reply{Hang: true}
			if afterDelta {
				reply.Text = "hello there"
			}
			s.Script(reply)
			before := len(s.Requests())
			ctx, cancel := context.WithCancel(dialectCtx(t))
			var ds []delta
			errc := make(chan error, 1)
			go func() {
				errc <- d.chat(ctx, userRound("hi"), func(x delta) error {
					ds = append(ds, x)
					cancel()
					return nil
				})
			}()
			if !afterDelta {
				if _, err := s.WaitRequests(dialectCtx(t), before+1); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
			select {
			case err := <-errc:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("after delta %v: error %v, want one wrapping context.Canceled", afterDelta, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("after delta %v: chat did not return once its context was cancelled", afterDelta)
			}
			cancel()
			if got := describeDeltas(ds); afterDelta != (len(got) == 1) || (afterDelta && got[0] != `text "hello th"`) {
				t.Errorf("after delta %v: deltas %q", afterDelta, got)
			}
			// The connection was closed: the server's handler saw the
			// client go away.
			if err := s.WaitIdle(dialectCtx(t)); err != nil {
				t.Fatal(err)
			}
			if n := len(s.Requests()) - before; n != 1 {
				t.Errorf("after delta %v: %d requests, want 1 (no retry)", afterDelta, n)
			}
		}
	})
}

func TestDialectEachErrorStops(t *testing.T) {
	t.Parallel()
	errStop := errors.New("the consumer is gone")
	forEachDialect(t, func(t *testing.T, tc dialectCase, s *fakemodel.Server, d dialect) {
		s.Script(fakemodel.Reply{Thinking: "a long train of thought", Text: "and a long answer", ChunkSize: 2})
		calls := 0
		err := d.chat(dialectCtx(t), userRound("hi"), func(delta) error {
			calls++
			return errStop
		})
		if err != errStop {
			t.Errorf("error %v, want each's own error", err)
		}
		if calls != 1 {
			t.Errorf("each was called %d times after it failed", calls-1)
		}
		if err := s.WaitIdle(dialectCtx(t)); err != nil {
			t.Fatal(err)
		}
		if n := len(s.Requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

// retryAnswers are well-formed streamed answers, "hi" and a stop, per dialect,
// one line of content first.
var retryAnswers = map[string][2]string{
	"ollama": {
		`{"message":{"role":"assistant","content":"hi"},"done":false}` + "\n",
		`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":1}` + "\n",
	},
	"openai": {
		`data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n",
	},
}

// retryAttempt is how the retry server answers one request.
type retryAttempt int

const (
	attemptAnswer        retryAttempt = iota
	attemptDrop                       // close the connection without an answer
	attemptEmpty                      // a 200 and an empty body
	attemptDropAfterLine              // one line of content, then close the connection
	attemptEndAfterLine               // one line of content, then end the body cleanly
)

// retryServer answers the n-th request as attempts[n] says, in the
// dialect named by label, and counts the requests.
func retryServer(t *testing.T, label string, attempts ...retryAttempt) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		i := int(n.Add(1)) - 1
		a := attemptAnswer
		if i < len(attempts) {
			a = attempts[i]
		}
		if a == attemptDrop {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusOK)
		switch a {
		case attemptAnswer:
			io.WriteString(w, retryAnswers[label][0]+retryAnswers[label][1])
		case attemptDropAfterLine, attemptEndAfterLine:
			io.WriteString(w, retryAnswers[label][0])
			http.NewResponseController(w).Flush()
			if a == attemptDropAfterLine {
				panic(http.ErrAbortHandler)
			}
		}
	}))
	srv.Start()
	t.Cleanup(srv.Close)
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("the test server listens on %s, not on 127.0.0.1", srv.URL)
	}
	return srv, &n
}

func TestDialectRetryOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		attempts []retryAttempt
		requests int32
		deltas   []string
		err      string // "" for success; else what the error must contain
	}{
		{"request dropped", []retryAttempt{attemptDrop}, 2, []string{`text "hi"`, "done stop"}, ""},
		{"empty stream", []retryAttempt{attemptEmpty}, 2, []string{`text "hi"`, "done stop"}, ""},
		{"dropped twice", []retryAttempt{attemptDrop, attemptDrop}, 2, nil, "sending the request"},
		{"empty twice", []retryAttempt{attemptEmpty, attemptEmpty}, 2, nil, "the stream ended before the answer was complete"},
		{"dropped after a delta", []retryAttempt{attemptDropAfterLine}, 1, []string{`text "hi"`}, "reading the answer"},
		{"ended after a delta", []retryAttempt{attemptEndAfterLine}, 1, []string{`text "hi"`}, "the stream ended before the answer was complete"},
	} {
		for _, dc := range dialectCases()[:2] { // the retry does not depend on mlx's quirks
			t.Run(tc.name+"/"+dc.name, func(t *testing.T) {
				t.Parallel()
				srv, n := retryServer(t, dc.label, tc.attempts...)
				ds, err := collectDeltas(dialectCtx(t), dc.open(srv.URL), userRound("hi"))
				switch {
				case tc.err == "" && err != nil:
					t.Errorf("error %v", err)
				case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) ||
					!strings.HasPrefix(err.Error(), dc.label+": ")):
					t.Errorf("error %v, want one saying %q", err, tc.err)
				}
				if got := dropUsage(describeDeltas(ds)); !reflect.DeepEqual(got, tc.deltas) {
					t.Errorf("deltas %q, want %q", got, tc.deltas)
				}
				if got := n.Load(); got != tc.requests {
					t.Errorf("%d requests, want %d", got, tc.requests)
				}
			})
		}
	}
}

// dropUsage drops the usage from described last deltas.
func dropUsage(lines []string) []string {
	for i, l := range lines {
		if strings.HasPrefix(l, "done ") {
			lines[i] = strings.Join(strings.Fields(l)[:2], " ")
		}
	}
	return lines
}

// readRecorded runs a dialect's reader over a recorded answer.
func readRecorded(label string, raw []byte) ([]delta, error) {
	var ds []delta
	emit := func(d delta) error {
		ds = append(ds, d)
		return nil
	}
	if label == "ollama" {
		return ds, readOllama(bytes.NewReader(raw), emit)
	}
	return ds, (&openaiStream{emit: emit}).read(bytes.NewReader(raw))
}

func TestDialectGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, label, file string }{
		{"Ollama", "ollama", "dialect_ollama.ndjson"},
		{"OpenAI", "openai", "dialect_openai.sse"},
		{"MLX", "openai", "dialect_mlx.sse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			golden, err := os.ReadFile("testdata/" + strings.Split(tc.file, ".")[0] + ".golden")
			if err != nil {
				t.Fatal(err)
			}
			ds, err := readRecorded(tc.label, raw)
			if err != nil {
				t.Fatal(err)
			}
			checkDeltaShape(t, ds)
			want := strings.Split(strings.TrimSuffix(string(golden), "\n"), "\n")
			if got := describeDeltas(ds); !reflect.DeepEqual(got, want) {
				t.Errorf("deltas\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// Cut anywhere before the line that ends it, the answer is an
			// error, never a silently shorter answer.
			end := bytes.LastIndex(raw, []byte("\n{")) // Ollama's done line
			if tc.label == "openai" {
				finish := bytes.Index(raw, []byte(`"finish_reason":"`))
				end = bytes.LastIndex(raw[:finish], []byte("data: "))
			}
			for cut := 0; cut < end; cut += 7 {
				if _, err := readRecorded(tc.label, raw[:cut]); err == nil {
					t.Fatalf("an answer cut at byte %d of %d read without error", cut, len(raw))
				}
			}
		})
	}
}

func TestOpenAIStreamQuirks(t *testing.T) {
	t.Parallel()
	chunk := func(delta string, finish string) string {
		f := "null"
		if finish != "" {
			f = strconv.Quote(finish)
		}
		return `data: {"choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + "}]}\n\n"
	}
	for _, tc := range []struct {
		name, stream string
		want         []string
		err          string
	}{
		{
			name: "invalid arguments are kept as a string",
			stream: chunk(`{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"city\": \"Tok"}}]}`, "") +
				chunk(`{}`, "tool_calls") + "data: [DONE]\n\n",
			want: []string{`tools c1 f {"_raw":"{\"city\": \"Tok"}`, "done tool_calls usage=nil"},
		},
		{
			name: "arguments that are not an object are kept as a string",
			stream: chunk(`{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"[1,2]"}}]}`, "") +
				"data: [DONE]\n\n",
			want: []string{`tools c1 f {"_raw":"[1,2]"}`, "done  usage=nil"},
		},
		{
			name: "fragments without an index",
			stream: chunk(`{"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\":"}}]}`, "") +
				chunk(`{"tool_calls":[{"function":{"arguments":"1}"}}]}`, "") +
				chunk(`{"tool_calls":[{"id":"c2","function":{"name":"g","arguments":""}}]}`, "stop") + "data: [DONE]\n\n",
			want: []string{`tools c1 f {"a":1} | c2 g {}`, "done stop usage=nil"},
		},
		{
			name: "reasoning sent twice under both names counts once",
			stream: chunk(`{"role":"assistant","reasoning":"hmm","reasoning_content":"hmm"}`, "") +
				chunk(`{"content":null}`, "stop") + "data: [DONE]\n\n",
			want: []string{`thinking "hmm"`, "done stop usage=nil"},
		},
		{
			name:   "a stream closed after its finish reason, without [DONE]",
			stream: chunk(`{"content":"hi"}`, "") + chunk(`{}`, "length"),
			want:   []string{`text "hi"`, "done length usage=nil"},
		},
		{
			name: "comments, event names and a data field without a space",
			stream: ": ping\n\nevent: message\nid: 1\ndata:" + strings.TrimPrefix(chunk(`{"content":"hi"}`, "stop"), "data: ") +
				"data: [DONE]\n\n",
			want: []string{`text "hi"`, "done stop usage=nil"},
		},
		{
			name:   "an OpenAI error object mid-stream",
			stream: chunk(`{"content":"hi"}`, "") + `data: {"error":{"message":"context length exceeded","type":"invalid_request_error"}}` + "\n\n",
			want:   []string{`text "hi"`},
			err:    "openai: context length exceeded",
		},
		{
			name:   "a line that is not server-sent events",
			stream: `{"error":"not streaming"}` + "\n",
			err:    `openai: unreadable line "{\"error\":\"not streaming\"}"`,
		},
		{
			name:   "data that is not JSON",
			stream: "data: {oops\n\n",
			err:    `openai: unreadable event "{oops"`,
		},
		{
			name:   "a stream cut before its finish reason",
			stream: chunk(`{"content":"hi"}`, ""),
			want:   []string{`text "hi"`},
			err:    "openai: the stream ended before the answer was complete",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ds, err := readRecorded("openai", []byte(tc.stream))
			if (tc.err == "") != (err == nil) || (err != nil && !strings.HasPrefix(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if got := describeDeltas(ds); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("deltas %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOllamaStreamQuirks(t *testing.T) {
	t.Parallel()
	const done = `{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}` + "\n"
	for _, tc := range []struct {
		name, stream string
		want         []string
		err          string
	}{
		{
			name:   "arguments as a string",
			stream: `{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{\"a\": 1}"}}]},"done":false}` + "\n" + done,
			want:   []string{`tools  f {"a":1}`, "done stop in=1 out=1 cache=0 cost=0"},
		},
		{
			name:   "missing and invalid arguments",
			stream: `{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f"}},{"function":{"name":"g","arguments":"oops"}}]},"done":false}` + "\n" + done,
			want:   []string{`tools  f {} |  g {"_raw":"oops"}`, "done stop in=1 out=1 cache=0 cost=0"},
		},
		{
			name:   "a whole answer in one line",
			stream: `{"message":{"role":"assistant","content":"hi","thinking":"hmm"},"done":true,"done_reason":"length","prompt_eval_count":5,"eval_count":2}`,
			want:   []string{`thinking "hmm"`, `text "hi"`, "done length in=5 out=2 cache=0 cost=0"},
		},
		{
			name:   "blank lines and CRLF",
			stream: "\r\n" + `{"message":{"role":"assistant","content":"hi"},"done":false}` + "\r\n\r\n" + done,
			want:   []string{`text "hi"`, "done stop in=1 out=1 cache=0 cost=0"},
		},
		{
			name:   "a line that is not JSON",
			stream: "<html>bad gateway</html>\n",
			err:    `ollama: unreadable line "<html>bad gateway</html>"`,
		},
		{
			name:   "a stream without its done line",
			stream: `{"message":{"role":"assistant","content":"hi"},"done":false}` + "\n",
			want:   []string{`text "hi"`},
			err:    "ollama: the stream ended before the answer was complete",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ds, err := readRecorded("ollama", []byte(tc.stream))
			if (tc.err == "") != (err == nil) || (err != nil && !strings.HasPrefix(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if got := describeDeltas(ds); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("deltas %q, want %q", got, tc.want)
			}
		})
	}
}

// fuzzDialect checks what a reader makes of any input: arguments are always
// a JSON object, and an answer read without error ends with its one Done.
func fuzzDialect(f *testing.F, label string, seeds ...string) {
	for _, s := range seeds {
		raw, err := os.ReadFile("testdata/" + s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add(bytes.Repeat([]byte("\n"), 3))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ds, err := readRecorded(label, raw)
		for i, d := range ds {
			for _, c := range d.ToolCalls {
				var obj map[string]any
				if json.Unmarshal(c.Arguments, &obj) != nil || obj == nil {
					t.Fatalf("delta %d: arguments %q are not a JSON object", i, c.Arguments)
				}
			}
			if d.Done != (err == nil && i == len(ds)-1) {
				t.Fatalf("delta %d of %d has Done %v with error %v", i, len(ds), d.Done, err)
			}
		}
		if err == nil && len(ds) == 0 {
			t.Fatal("an answer without a last delta read without error")
		}
	})
}

func FuzzOllamaStream(f *testing.F) { fuzzDialect(f, "ollama", "dialect_ollama.ndjson") }

func FuzzOpenAIStream(f *testing.F) {
	fuzzDialect(f, "openai", "dialect_openai.sse", "dialect_mlx.sse")
}
