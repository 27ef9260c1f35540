package fakemodel_test

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

func anthropicBody(text string, stream bool) map[string]any {
	return map[string]any{
		"model":      "claude-sonnet-5",
		"max_tokens": 1024,
		"stream":     stream,
		"messages": []any{map[string]any{
			"role":    "user",
			"content": []any{map[string]any{"type": "text", "text": text}},
		}},
	}
}

// decodeAnthropic reads an Anthropic SSE stream the way the SDK does,
// checking the order of events on the way.
func decodeAnthropic(t *testing.T, body io.Reader) decoded {
	t.Helper()
	var (
		d      decoded
		blocks = map[int]string{} // index -> block type
		open   = -1
	)
	for i, ev := range readSSE(t, body) {
		var e struct {
			Type    string `json:"type"`
			Index   int    `json:"index"`
			Message struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			ContentBlock struct {
				Type string `json:"type"`
				ID   string `json:"id"`
				Name string `json:"name"`
			} `json:"content_block"`
			Delta struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				Thinking    string `json:"thinking"`
				Signature   string `json:"signature"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
			t.Fatalf("event %d %q: %v", i, ev.Data, err)
		}
		if e.Type != ev.Event {
			t.Fatalf("event %d is named %q but has type %q", i, ev.Event, e.Type)
		}
		switch {
		case i == 0 && e.Type != "message_start":
			t.Fatalf("first event is %q, want message_start", e.Type)
		case i == 1 && e.Type != "ping":
			t.Fatalf("second event is %q, want ping", e.Type)
		}
		switch e.Type {
		case "message_start":
			d.Input = e.Message.Usage.InputTokens
		case "content_block_start":
			if open != -1 {
				t.Fatalf("block %d starts while %d is open", e.Index, open)
			}
			open, blocks[e.Index] = e.Index, e.ContentBlock.Type
			if e.ContentBlock.Type == "tool_use" {
				d.Calls = append(d.Calls, call{ID: e.ContentBlock.ID, Name: e.ContentBlock.Name})
			}
		case "content_block_delta":
			if e.Index != open {
				t.Fatalf("delta for block %d while %d is open", e.Index, open)
			}
			switch e.Delta.Type {
			case "thinking_delta":
				d.Thinking += e.Delta.Thinking
			case "signature_delta":
				if e.Delta.Signature == "" || blocks[e.Index] != "thinking" {
					t.Fatalf("bad signature delta %s", ev.Data)
				}
			case "text_delta":
				d.Text += e.Delta.Text
			case "input_json_delta":
				d.Calls[len(d.Calls)-1].Args += e.Delta.PartialJSON
			default:
				t.Fatalf("unknown delta %s", ev.Data)
			}
		case "content_block_stop":
			if e.Index != open {
				t.Fatalf("stop for block %d while %d is open", e.Index, open)
			}
			open = -1
		case "message_delta":
			d.Stop, d.Output = e.Delta.StopReason, e.Usage.OutputTokens
		case "message_stop":
			d.Done = true
		case "error":
			d.Error = e.Error.Type + ": " + e.Error.Message
		}
	}
	return d
}

func TestAnthropicStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Thinking:  "Let me think about this fake problem.",
		Text:      "I'll use a tool.",
		ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command": "echo hi", "description": "run it"}`)}},
		Usage:     fakemodel.Usage{Input: 388},
		ChunkSize: 5,
	})
	resp := post(t, testContext(t), s.URL()+"/v1/messages?beta=true", anthropicBody("hello", true))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	d := decodeAnthropic(t, resp.Body)
	if d.Thinking != "Let me think about this fake problem." || d.Text != "I'll use a tool." {
		t.Errorf("thinking %q, text %q", d.Thinking, d.Text)
	}
	if len(d.Calls) != 1 || d.Calls[0].Name != "Bash" || !strings.HasPrefix(d.Calls[0].ID, "toolu_") ||
		d.Calls[0].Args != `{"command":"echo hi","description":"run it"}` {
		t.Errorf("calls = %+v", d.Calls)
	}
	if d.Stop != "tool_use" || !d.Done || d.Error != "" {
		t.Errorf("stop %q, done %v, error %q", d.Stop, d.Done, d.Error)
	}
	if d.Input != 388 || d.Output < 5 {
		t.Errorf("usage in %d out %d", d.Input, d.Output)
	}
}

func TestAnthropicTextOnlyEndsTurn(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Text: "pong from fake model"}, fakemodel.Reply{Text: "cut", StopReason: "length"})
	ctx := testContext(t)
	d := decodeAnthropic(t, post(t, ctx, s.URL()+"/v1/messages", anthropicBody("hi", true)).Body)
	if d.Text != "pong from fake model" || d.Stop != "end_turn" || len(d.Calls) != 0 || d.Thinking != "" {
		t.Errorf("decoded %+v", d)
	}
	// Another dialect's stop reason is translated.
	d = decodeAnthropic(t, post(t, ctx, s.URL()+"/v1/messages", anthropicBody("hi", true)).Body)
	if d.Stop != "max_tokens" {
		t.Errorf("stop = %q, want max_tokens", d.Stop)
	}
}

func TestAnthropicErrorBeforeStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Status: 529},
		fakemodel.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorMessage: "prompt is too long"},
	)
	ctx := testContext(t)
	for _, want := range []struct {
		status    int
		typ, mesg string
	}{{529, "overloaded_error", "Overloaded"}, {400, "invalid_request_error", "prompt is too long"}} {
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		decodeJSON(t, post(t, ctx, s.URL()+"/v1/messages?beta=true", anthropicBody("hi", true)), want.status, &e)
		if e.Type != "error" || e.Error.Type != want.typ || e.Error.Message != want.mesg {
			t.Errorf("error body %+v, want %+v", e, want)
		}
	}
	if n := len(s.Requests()); n != 2 {
		t.Errorf("%d requests recorded, want 2", n)
	}
}

func TestAnthropicMidStreamError(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Text:           "partial answer",
		ToolCalls:      []fakemodel.ToolCall{{Name: "Bash"}},
		MidStreamError: "Overloaded",
		ErrorType:      "overloaded_error",
	})
	d := decodeAnthropic(t, post(t, testContext(t), s.URL()+"/v1/messages", anthropicBody("hi", true)).Body)
	if d.Text != "partial answer" || len(d.Calls) != 0 {
		t.Errorf("text %q, calls %+v", d.Text, d.Calls)
	}
	if d.Error != "overloaded_error: Overloaded" || d.Done || d.Stop != "" {
		t.Errorf("error %q, done %v, stop %q", d.Error, d.Done, d.Stop)
	}
}

func TestAnthropicNonStreaming(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Thinking:  "hmm",
		Text:      "done",
		ToolCalls: []fakemodel.ToolCall{{ID: "toolu_given", Name: "Read", Input: json.RawMessage(`{"file_path":"/x"}`)}},
		Usage:     fakemodel.Usage{Input: 7, Output: 3, CacheRead: 2, CacheCreation: 1},
	})
	var msg struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		Model      string `json:"model"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type      string          `json:"type"`
			Text      string          `json:"text"`
			Thinking  string          `json:"thinking"`
			Signature string          `json:"signature"`
			ID        string          `json:"id"`
			Name      string          `json:"name"`
			Input     json.RawMessage `json:"input"`
		} `json:"content"`
		Usage map[string]int `json:"usage"`
	}
	decodeJSON(t, post(t, testContext(t), s.URL()+"/v1/messages", anthropicBody("hi", false)), http.StatusOK, &msg)
	if msg.Type != "message" || msg.Role != "assistant" || msg.Model != "claude-sonnet-5" || msg.StopReason != "tool_use" ||
		!strings.HasPrefix(msg.ID, "msg_") {
		t.Errorf("message %+v", msg)
	}
	if len(msg.Content) != 3 || msg.Content[0].Thinking != "hmm" || msg.Content[0].Signature == "" ||
		msg.Content[1].Text != "done" || msg.Content[2].ID != "toolu_given" || string(msg.Content[2].Input) != `{"file_path":"/x"}` {
		t.Errorf("content %+v", msg.Content)
	}
	wantUsage := map[string]int{"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 1}
	if !reflect.DeepEqual(msg.Usage, wantUsage) {
		t.Errorf("usage %v, want %v", msg.Usage, wantUsage)
	}
}

// TestClaudeCapturedRequests replays the requests Claude Code 2.1.197 sent
// (three turns: Bash tool, thinking + Read tool, plain text) and checks what
// the Server makes of them and that the replies decode as scripted.
func TestClaudeCapturedRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	bash := fakemodel.ToolCall{Name: "Bash", Input: json.RawMessage(`{"command":"echo hi","description":"run a command for the test"}`)}
	s.Script(
		fakemodel.Reply{Text: "I'll use a tool.", ToolCalls: []fakemodel.ToolCall{bash}},
		fakemodel.Reply{Text: "tool said: hi"},
		fakemodel.Reply{Thinking: "Let me think about this fake problem.", Text: "I'll use a tool.",
			ToolCalls: []fakemodel.ToolCall{{Name: "Read", Input: json.RawMessage(`{"file_path":"/tmp/scratch/work/hello.txt"}`)}}},
		fakemodel.Reply{Text: "tool said: 1\thello file content\n2"},
		fakemodel.Reply{Text: "pong from fake model."},
	)
	ctx := testContext(t)
	caps := loadCaptured(t, "claude-requests.sample.jsonl")
	for i, c := range caps {
		d := decodeAnthropic(t, replay(t, ctx, s, c).Body)
		if !d.Done || d.Text == "" {
			t.Errorf("reply %d: %+v", i, d)
		}
	}

	reqs := s.Requests()
	if len(reqs) != len(caps) {
		t.Fatalf("%d requests recorded, want %d", len(reqs), len(caps))
	}
	want := []struct {
		userText string
		results  []fakemodel.ToolResult
	}{
		// A <system-reminder> block comes first and a role "system"
		// message follows the user message.
		{userText: "First turn. TOOL_BASH: echo hi"},
		{results: []fakemodel.ToolResult{{ID: "toolu_fake000066", Name: "Bash", Content: "hi"}}},
		{userText: "Second turn. THINK TOOL_READ: /tmp/scratch/work/hello.txt"},
		{results: []fakemodel.ToolResult{{ID: "toolu_fake000068", Name: "Read", Content: "1\thello file content\n2\t"}}},
		{userText: "Third turn, just say something."},
	}
	for i, r := range reqs {
		if r.Dialect != fakemodel.DialectAnthropic || r.Method != http.MethodPost || r.Path != "/v1/messages" ||
			r.RawQuery != "beta=true" || r.Model != "claude-sonnet-5" || !r.Stream {
			t.Errorf("request %d: %s %s %s?%s model %q stream %v", i, r.Dialect, r.Method, r.Path, r.RawQuery, r.Model, r.Stream)
		}
		if r.Header.Get("X-App") != "cli" || r.Header.Get("Anthropic-Version") != "2023-06-01" {
			t.Errorf("request %d headers %v", i, r.Header)
		}
		if len(r.Tools) != 24 || r.Tools[1] != "Bash" || r.Tools[9] != "Read" {
			t.Errorf("request %d tools %v", i, r.Tools)
		}
		if r.UserText != want[i].userText || !reflect.DeepEqual(r.ToolResults, want[i].results) {
			t.Errorf("request %d: user text %q, results %+v; want %q, %+v", i, r.UserText, r.ToolResults, want[i].userText, want[i].results)
		}
		if !json.Valid(r.Body) {
			t.Errorf("request %d body is not the JSON sent", i)
		}
	}
}
