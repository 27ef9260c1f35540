package fakemodel_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

func ollamaBody(text string, stream bool) map[string]any {
	return map[string]any{
		"model":    "fake-model",
		"stream":   stream,
		"messages": []any{map[string]any{"role": "user", "content": text}},
		"tools":    []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}},
	}
}

type ollamaResponse struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Message   *struct {
		Role      string  `json:"role"`
		Content   *string `json:"content"`
		Thinking  string  `json:"thinking"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Index     int             `json:"index"`
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	Done            bool   `json:"done"`
	DoneReason      string `json:"done_reason"`
	TotalDuration   int64  `json:"total_duration"`
	PromptEvalCount int    `json:"prompt_eval_count"`
	EvalCount       int    `json:"eval_count"`
	EvalDuration    int64  `json:"eval_duration"`
	Error           string `json:"error"`
}

func (r ollamaResponse) add(t *testing.T, d *decoded) {
	t.Helper()
	if r.Error != "" {
		d.Error = r.Error
		return
	}
	if r.Message == nil || r.Message.Role != "assistant" || r.Message.Content == nil || r.CreatedAt == "" {
		t.Fatalf("chunk without an assistant message with content: %+v", r)
	}
	d.Thinking += r.Message.Thinking
	d.Text += *r.Message.Content
	for _, tc := range r.Message.ToolCalls {
		if len(tc.Function.Arguments) == 0 || tc.Function.Arguments[0] != '{' {
			t.Fatalf("arguments are not an object: %s", tc.Function.Arguments)
		}
		d.Calls = append(d.Calls, call{ID: tc.ID, Name: tc.Function.Name, Args: string(tc.Function.Arguments)})
	}
	if r.Done {
		d.Done, d.Stop, d.Input, d.Output = true, r.DoneReason, r.PromptEvalCount, r.EvalCount
		if r.TotalDuration <= 0 || r.EvalDuration <= 0 {
			t.Errorf("final chunk without durations: %+v", r)
		}
	}
}

func decodeOllama(t *testing.T, body io.Reader) decoded {
	t.Helper()
	var d decoded
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		if d.Done || d.Error != "" {
			t.Fatalf("line after the end: %s", sc.Text())
		}
		var r ollamaResponse
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		r.add(t, &d)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOllamaStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Thinking:  "weather needs a tool",
		Text:      "Checking.",
		ToolCalls: []fakemodel.ToolCall{{Name: "get_weather", Input: json.RawMessage(`{"city":"Tokyo"}`)}},
		Usage:     fakemodel.Usage{Input: 26, Output: 9},
	})
	// stream defaults to true.
	body := ollamaBody("weather in Tokyo?", true)
	delete(body, "stream")
	resp := post(t, testContext(t), s.URL()+"/api/chat", body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	d := decodeOllama(t, resp.Body)
	if d.Thinking != "weather needs a tool" || d.Text != "Checking." || !d.Done {
		t.Errorf("decoded %+v", d)
	}
	// done_reason stays "stop" after tool calls.
	if d.Stop != "stop" || d.Input != 26 || d.Output != 9 {
		t.Errorf("stop %q, counts %d/%d", d.Stop, d.Input, d.Output)
	}
	if len(d.Calls) != 1 || d.Calls[0].Name != "get_weather" || d.Calls[0].Args != `{"city":"Tokyo"}` ||
		!regexp.MustCompile(`^call_[a-z0-9]{8}$`).MatchString(d.Calls[0].ID) {
		t.Errorf("calls %+v", d.Calls)
	}
	r := s.Requests()
	if len(r) != 1 || r[0].Dialect != fakemodel.DialectOllama || !r[0].Stream || r[0].UserText != "weather in Tokyo?" ||
		!reflect.DeepEqual(r[0].Tools, []string{"get_weather"}) {
		t.Errorf("requests %+v", r)
	}
}

func TestOllamaNonStreaming(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Thinking: "t", Text: "22°C", ToolCalls: []fakemodel.ToolCall{{Name: "f"}}, StopReason: "max_tokens"})
	body := map[string]any{
		"model":  "fake-model",
		"stream": false,
		"messages": []any{
			map[string]any{"role": "user", "content": "weather?"},
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{
				map[string]any{"id": "call_abc", "function": map[string]any{"name": "get_weather", "arguments": map[string]any{"city": "Tokyo"}}},
			}},
			map[string]any{"role": "tool", "tool_name": "get_weather", "content": "22°C"},
			map[string]any{"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
		},
	}
	var r ollamaResponse
	decodeJSON(t, post(t, testContext(t), s.URL()+"/api/chat", body), http.StatusOK, &r)
	var d decoded
	r.add(t, &d)
	if d.Thinking != "t" || d.Text != "22°C" || len(d.Calls) != 1 || d.Calls[0].Args != "{}" || !d.Done || d.Stop != "length" {
		t.Errorf("decoded %+v", d)
	}
	req := s.Requests()[0]
	want := []fakemodel.ToolResult{
		{Name: "get_weather", Content: "22°C"},
		{ID: "call_abc", Name: "get_weather", Content: "sunny"},
	}
	if req.Stream || req.UserText != "weather?" || !reflect.DeepEqual(req.ToolResults, want) {
		t.Errorf("request: stream %v, %q, %+v", req.Stream, req.UserText, req.ToolResults)
	}
}

func TestOllamaErrors(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Status: http.StatusNotFound, ErrorMessage: `model "nope" not found, try pulling it first`},
		fakemodel.Reply{Text: "so far so", MidStreamError: "unexpected EOF"},
	)
	ctx := testContext(t)
	var e struct {
		Error string `json:"error"`
	}
	decodeJSON(t, post(t, ctx, s.URL()+"/api/chat", ollamaBody("hi", true)), http.StatusNotFound, &e)
	if e.Error != `model "nope" not found, try pulling it first` {
		t.Errorf("error %q", e.Error)
	}
	resp := post(t, ctx, s.URL()+"/api/chat", ollamaBody("hi", true))
	d := decodeOllama(t, resp.Body)
	if resp.StatusCode != http.StatusOK || d.Text != "so far so" || d.Error != "unexpected EOF" || d.Done {
		t.Errorf("status %d, decoded %+v", resp.StatusCode, d)
	}
}

func TestOllamaTagsShowVersion(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{Models: []string{"qwen3:4b", "llama3.2:latest"}})
	ctx := testContext(t)
	var tags struct {
		Models []struct {
			Name    string `json:"name"`
			Model   string `json:"model"`
			Digest  string `json:"digest"`
			Details struct {
				Family string `json:"family"`
			} `json:"details"`
		} `json:"models"`
	}
	decodeJSON(t, get(t, ctx, s.URL()+"/api/tags"), http.StatusOK, &tags)
	if len(tags.Models) != 2 || tags.Models[0].Name != "qwen3:4b" || tags.Models[1].Model != "llama3.2:latest" ||
		len(tags.Models[0].Digest) != 64 || tags.Models[0].Details.Family == "" {
		t.Errorf("tags %+v", tags)
	}
	var version map[string]string
	decodeJSON(t, get(t, ctx, s.URL()+"/api/version"), http.StatusOK, &version)
	if version["version"] == "" {
		t.Errorf("version %v", version)
	}
	var show struct {
		Capabilities []string `json:"capabilities"`
	}
	decodeJSON(t, post(t, ctx, s.URL()+"/api/show", `{"model":"qwen3:4b"}`), http.StatusOK, &show)
	if len(show.Capabilities) == 0 {
		t.Errorf("show %+v", show)
	}
	if len(s.Requests()) != 0 {
		t.Error("metadata calls were recorded as model requests")
	}
}
