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

func openaiBody(text string, stream bool) map[string]any {
	return map[string]any{
		"model":          "fake-model",
		"stream":         stream,
		"stream_options": map[string]any{"include_usage": true},
		"messages": []any{
			map[string]any{"role": "system", "content": "be brief"},
			map[string]any{"role": "user", "content": text},
		},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash"}}},
	}
}

// openaiChunk holds the fields of a chat completion chunk that either
// dialect (OpenAI or mlx) uses.
type openaiChunk struct {
	Object  string         `json:"object"`
	Choices []openaiChoice `json:"choices"`
	Usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

type openaiChoice struct {
	Delta        map[string]json.RawMessage `json:"delta"`
	FinishReason *string                    `json:"finish_reason"`
}

func (c openaiChoice) delta(t *testing.T) openaiDelta {
	t.Helper()
	raw, err := json.Marshal(c.Delta)
	if err != nil {
		t.Fatal(err)
	}
	var d openaiDelta
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("delta %s: %v", raw, err)
	}
	return d
}

type openaiDelta struct {
	Role             string `json:"role"`
	Content          string `json:"content"`
	ReasoningContent string `json:"reasoning_content"`
	Reasoning        string `json:"reasoning"`
	ToolCalls        []struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// openaiChunks parses an OpenAI-style SSE stream into its chunks, checking
// that it ends with [DONE] (then Done is set) or an error.
func openaiChunks(t *testing.T, body io.Reader) (chunks []openaiChunk, comments []string, done bool) {
	t.Helper()
	for _, ev := range readSSE(t, body) {
		switch {
		case ev.Event == ":":
			comments = append(comments, ev.Data)
			continue
		case done:
			t.Fatalf("event after [DONE]: %+v", ev)
		case ev.Event != "":
			t.Fatalf("named event %+v", ev)
		case ev.Data == "[DONE]":
			done = true
			continue
		}
		var c openaiChunk
		if err := json.Unmarshal([]byte(ev.Data), &c); err != nil {
			t.Fatalf("chunk %q: %v", ev.Data, err)
		}
		chunks = append(chunks, c)
	}
	return chunks, comments, done
}

// decodeOpenAI accumulates a stream as the openai clients do, accepting
// either reasoning field.
func decodeOpenAI(t *testing.T, body io.Reader) decoded {
	t.Helper()
	chunks, _, done := openaiChunks(t, body)
	return accumulateOpenAI(t, chunks, done)
}

func accumulateOpenAI(t *testing.T, chunks []openaiChunk, done bool) decoded {
	t.Helper()
	d := decoded{Done: done}
	for _, c := range chunks {
		if c.Error != nil {
			d.Error = string(c.Error)
		}
		if c.Usage != nil {
			d.Input, d.Output = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			delta := ch.delta(t)
			d.Thinking += delta.ReasoningContent + delta.Reasoning
			d.Text += delta.Content
			for _, tc := range delta.ToolCalls {
				if tc.Index == len(d.Calls) {
					d.Calls = append(d.Calls, call{})
				}
				c := &d.Calls[tc.Index]
				c.ID += tc.ID
				c.Name += tc.Function.Name
				c.Args += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				d.Stop = *ch.FinishReason
			}
		}
	}
	return d
}

func TestOpenAIStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Thinking:  "Let me think about this fake problem.",
		Text:      "Running it.",
		ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: json.RawMessage(`{"command":"echo hi-from-acp"}`)}},
		Usage:     fakemodel.Usage{Input: 176, Output: 20},
	})
	resp := post(t, testContext(t), s.URL()+"/v1/chat/completions", openaiBody("hi", true))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	chunks, comments, done := openaiChunks(t, resp.Body)
	if !done || len(comments) != 0 {
		t.Fatalf("done %v, comments %q", done, comments)
	}
	// The first chunk only announces the role; no other repeats it.
	if first := chunks[0].Choices[0]; len(first.Delta) != 2 || first.delta(t).Role != "assistant" || first.delta(t).Content != "" {
		t.Errorf("first chunk delta %v", first.Delta)
	}
	fragments := 0
	for i, c := range chunks[1:] {
		for _, ch := range c.Choices {
			if _, ok := ch.Delta["role"]; ok {
				t.Errorf("chunk %d repeats the role", i+1)
			}
			if _, ok := ch.Delta["reasoning"]; ok {
				t.Errorf("chunk %d uses mlx's reasoning field", i+1)
			}
			if ch.Delta["tool_calls"] != nil {
				fragments++
			}
		}
	}
	if fragments < 3 {
		t.Errorf("tool call sent in %d chunks, want its arguments in fragments", fragments)
	}
	// The last chunk carries only the usage.
	last := chunks[len(chunks)-1]
	if last.Object != "chat.completion.chunk" || len(last.Choices) != 0 || last.Usage == nil ||
		last.Usage.PromptTokens != 176 || last.Usage.CompletionTokens != 20 || last.Usage.TotalTokens != 196 {
		t.Errorf("last chunk %+v", last)
	}

	d := accumulateOpenAI(t, chunks, done)
	if d.Thinking != "Let me think about this fake problem." || d.Text != "Running it." || d.Stop != "tool_calls" {
		t.Errorf("decoded %+v", d)
	}
	if len(d.Calls) != 1 || d.Calls[0].Name != "bash" || !strings.HasPrefix(d.Calls[0].ID, "call_") ||
		d.Calls[0].Args != `{"command":"echo hi-from-acp"}` {
		t.Errorf("calls %+v", d.Calls)
	}
}

func TestOpenAIStreamWithoutUsage(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Text: "plain"})
	body := openaiBody("hi", true)
	delete(body, "stream_options")
	// The short alias path is served too.
	chunks, _, done := openaiChunks(t, post(t, testContext(t), s.URL()+"/chat/completions", body).Body)
	d := accumulateOpenAI(t, chunks, done)
	if d.Text != "plain" || d.Stop != "stop" || !d.Done {
		t.Errorf("decoded %+v", d)
	}
	for _, c := range chunks {
		if c.Usage != nil || len(c.Choices) == 0 {
			t.Errorf("usage chunk without include_usage: %+v", c)
		}
	}
}

func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Status: http.StatusTooManyRequests, ErrorMessage: "slow down"},
		fakemodel.Reply{Text: "half an answer", MidStreamError: "model crashed"},
	)
	ctx := testContext(t)
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	decodeJSON(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", true)), http.StatusTooManyRequests, &e)
	if e.Error.Message != "slow down" || e.Error.Type != "rate_limit_error" {
		t.Errorf("error %+v", e)
	}

	d := decodeOpenAI(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", true)).Body)
	if d.Text != "half an answer" || d.Done || d.Stop != "" {
		t.Errorf("decoded %+v", d)
	}
	if err := json.Unmarshal([]byte(d.Error), &e.Error); err != nil || e.Error.Message != "model crashed" || e.Error.Type != "server_error" {
		t.Errorf("mid-stream error %s (%v)", d.Error, err)
	}
}

func TestOpenAINonStreaming(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Thinking: "hmm", ToolCalls: []fakemodel.ToolCall{{Name: "read", Input: json.RawMessage(`{"filePath":"/x"}`)}}},
		fakemodel.Reply{Text: "hello", Usage: fakemodel.Usage{Input: 5, Output: 1, CacheRead: 3}},
	)
	ctx := testContext(t)
	type completion struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role             string  `json:"role"`
				Content          *string `json:"content"`
				ReasoningContent string  `json:"reasoning_content"`
				ToolCalls        []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			TotalTokens         int `json:"total_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	var c completion
	decodeJSON(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", false)), http.StatusOK, &c)
	m := c.Choices[0].Message
	if c.Object != "chat.completion" || m.Role != "assistant" || m.Content != nil || m.ReasoningContent != "hmm" ||
		c.Choices[0].FinishReason != "tool_calls" || len(m.ToolCalls) != 1 || m.ToolCalls[0].Type != "function" ||
		m.ToolCalls[0].Function.Name != "read" || m.ToolCalls[0].Function.Arguments != `{"filePath":"/x"}` {
		t.Errorf("completion %+v", c)
	}
	c = completion{}
	decodeJSON(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", false)), http.StatusOK, &c)
	if m := c.Choices[0].Message; m.Content == nil || *m.Content != "hello" || c.Choices[0].FinishReason != "stop" ||
		c.Usage.PromptTokens != 8 || c.Usage.TotalTokens != 9 || c.Usage.PromptTokensDetails.CachedTokens != 3 {
		t.Errorf("completion %+v", c)
	}
}

func TestOpenAIModels(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{Models: []string{"a", "b"}})
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	decodeJSON(t, get(t, testContext(t), s.URL()+"/v1/models"), http.StatusOK, &list)
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "a" || list.Data[1].Object != "model" {
		t.Errorf("models %+v", list)
	}
}

// TestOpencodeCapturedRequests replays what opencode 1.18.33 sent: a
// title-generation call, then a turn with a bash tool call and its result,
// then a second turn.
func TestOpencodeCapturedRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Thinking: "Let me think about this fake problem.",
			ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: json.RawMessage(`{"command":"echo hi-from-acp"}`)}}},
		fakemodel.Reply{Text: "tool said: hi-from-acp"},
		fakemodel.Reply{Text: "third"},
	)
	ctx := testContext(t)
	caps := loadCaptured(t, "opencode-requests.sample.jsonl")

	// The title call is answered without taking a scripted reply.
	title := decodeOpenAI(t, replay(t, ctx, s, caps[0]).Body)
	if title.Text == "" || !title.Done || s.Pending() != 3 || len(s.Requests()) != 0 {
		t.Fatalf("title reply %+v; %d pending, %d recorded", title, s.Pending(), len(s.Requests()))
	}
	for i, c := range caps[1:] {
		if d := decodeOpenAI(t, replay(t, ctx, s, c).Body); !d.Done {
			t.Errorf("reply %d: %+v", i, d)
		}
	}
	reqs := s.Requests()
	if len(reqs) != 3 || s.Pending() != 0 {
		t.Fatalf("%d requests, %d pending", len(reqs), s.Pending())
	}
	wantTools := []string{"bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write"}
	if !reflect.DeepEqual(reqs[0].Tools, wantTools) {
		t.Errorf("tools %v", reqs[0].Tools)
	}
	if reqs[0].UserText != "THINK TOOL_BASH: echo hi-from-acp" || reqs[0].ToolResults != nil || reqs[0].Header.Get("Authorization") != "Bearer sk-test" {
		t.Errorf("request 0: %q %+v", reqs[0].UserText, reqs[0].ToolResults)
	}
	wantResults := []fakemodel.ToolResult{{ID: "call_fake000002", Name: "bash", Content: "hi-from-acp\n"}}
	if !reflect.DeepEqual(reqs[1].ToolResults, wantResults) || reqs[1].UserText != "THINK TOOL_BASH: echo hi-from-acp" {
		t.Errorf("request 1: %q %+v", reqs[1].UserText, reqs[1].ToolResults)
	}
	if reqs[2].UserText != "TOOL_READ: /tmp/scratch/work-oc/hello.txt" || reqs[2].ToolResults != nil {
		t.Errorf("request 2: %q %+v", reqs[2].UserText, reqs[2].ToolResults)
	}
	for _, r := range reqs {
		if r.Dialect != fakemodel.DialectOpenAI || r.Model != "fake-model" || !r.Stream {
			t.Errorf("request %+v", r)
		}
	}
}
