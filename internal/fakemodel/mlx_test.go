package fakemodel_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

func TestMLXStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true})
	s.Script(fakemodel.Reply{
		Thinking: "thinking it over",
		Text:     "calling two tools",
		ToolCalls: []fakemodel.ToolCall{
			{Name: "get_weather", Input: json.RawMessage(`{"city": "Tokyo"}`)},
			{Name: "get_time"},
		},
		Usage: fakemodel.Usage{Input: 40, Output: 12, CacheRead: 4},
	})
	resp := post(t, testContext(t), s.URL()+"/v1/chat/completions", openaiBody("hi", true))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// Keep-alive comments come before the first chunk.
	if !regexp.MustCompile(`^(: keepalive \d+/\d+\n\n)+data: `).Match(raw) {
		t.Errorf("stream does not start with keep-alive comments: %.120q", raw)
	}
	chunks, comments, done := openaiChunks(t, strings.NewReader(string(raw)))
	if !done || len(comments) == 0 {
		t.Fatalf("done %v, comments %q", done, comments)
	}

	contentChunks := chunks[:len(chunks)-1]
	for i, c := range contentChunks {
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %+v", i, c)
		}
		delta := c.Choices[0].Delta
		if string(delta["role"]) != `"assistant"` {
			t.Errorf("chunk %d has no assistant role: %v", i, delta)
		}
		if len(delta) < 2 && c.Choices[0].FinishReason == nil {
			t.Errorf("chunk %d is a role-only chunk", i)
		}
		if content, ok := delta["content"]; ok && string(content) == `""` {
			t.Errorf("chunk %d has empty content", i)
		}
		if _, ok := delta["reasoning_content"]; ok {
			t.Errorf("chunk %d uses reasoning_content", i)
		}
		for _, tc := range c.Choices[0].delta(t).ToolCalls {
			if !json.Valid([]byte(tc.Function.Arguments)) || tc.ID == "" || tc.Function.Name == "" {
				t.Errorf("chunk %d: tool call not whole: %+v", i, tc)
			}
		}
	}

	usage := chunks[len(chunks)-1]
	if usage.Object != "chat.completion" || usage.Choices == nil || len(usage.Choices) != 0 || usage.Usage == nil ||
		usage.Usage.PromptTokens != 44 || usage.Usage.CompletionTokens != 12 || usage.Usage.TotalTokens != 56 {
		t.Errorf("usage event %+v", usage)
	}

	d := accumulateOpenAI(t, chunks, done)
	if d.Thinking != "thinking it over" || d.Text != "calling two tools" || d.Stop != "tool_calls" {
		t.Errorf("decoded %+v", d)
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if len(d.Calls) != 2 || d.Calls[0].Args != `{"city":"Tokyo"}` || d.Calls[1].Args != `{}` ||
		!uuid.MatchString(d.Calls[0].ID) || d.Calls[0].ID == d.Calls[1].ID {
		t.Errorf("calls %+v", d.Calls)
	}
}

func TestMLXStreamWithoutUsage(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true})
	s.Script(fakemodel.Reply{Text: "plain"})
	body := openaiBody("hi", true)
	delete(body, "stream_options")
	chunks, _, done := openaiChunks(t, post(t, testContext(t), s.URL()+"/chat/completions", body).Body)
	d := accumulateOpenAI(t, chunks, done)
	if d.Text != "plain" || d.Stop != "stop" || !d.Done {
		t.Errorf("decoded %+v", d)
	}
	for _, c := range chunks {
		if c.Usage != nil || c.Object != "chat.completion.chunk" {
			t.Errorf("usage without include_usage: %+v", c)
		}
	}
}

func TestMLXRequiresContentLength(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true})
	// A body of unknown length is sent chunked, without Content-Length.
	req, err := http.NewRequestWithContext(testContext(t), http.MethodPost, s.URL()+"/v1/chat/completions",
		io.MultiReader(strings.NewReader(`{"model":"m",`), strings.NewReader(`"messages":[]}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error string `json:"error"`
	}
	decodeJSON(t, resp, http.StatusLengthRequired, &e)
	if e.Error == "" || len(s.Requests()) != 0 {
		t.Errorf("error %q, %d requests", e.Error, len(s.Requests()))
	}
}

func TestMLXErrors(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true})
	s.Script(
		fakemodel.Reply{Status: http.StatusNotFound, ErrorMessage: "model not found"},
		fakemodel.Reply{Text: "so far", MidStreamError: "generation failed"},
	)
	ctx := testContext(t)
	var e struct {
		Error string `json:"error"`
	}
	decodeJSON(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", true)), http.StatusNotFound, &e)
	if e.Error != "model not found" {
		t.Errorf("error %+v", e)
	}
	d := decodeOpenAI(t, post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody("hi", true)).Body)
	if d.Text != "so far" || d.Error != `"generation failed"` || d.Done {
		t.Errorf("decoded %+v", d)
	}
	decodeJSON(t, post(t, ctx, s.URL()+"/v1/chat/completions", "{not json"), http.StatusBadRequest, &e)
	if e.Error == "" {
		t.Error("no error message for malformed JSON")
	}
}

func TestMLXNonStreaming(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true})
	s.Script(fakemodel.Reply{Thinking: "hmm", ToolCalls: []fakemodel.ToolCall{{Name: "f", Input: json.RawMessage(`{"a":1}`)}}})
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Message      map[string]json.RawMessage `json:"message"`
			FinishReason string                     `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	decodeJSON(t, post(t, testContext(t), s.URL()+"/v1/chat/completions", openaiBody("hi", false)), http.StatusOK, &c)
	m := c.Choices[0].Message
	if c.Object != "chat.completion" || string(m["content"]) != "null" || string(m["reasoning"]) != `"hmm"` ||
		m["tool_calls"] == nil || c.Choices[0].FinishReason != "tool_calls" || c.Usage.PromptTokensDetails == nil {
		t.Errorf("completion %+v", c)
	}
}

func TestMLXHealthAndModels(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{MLX: true, Models: []string{"mlx-community/Qwen3-4B-4bit"}})
	ctx := testContext(t)
	var health map[string]string
	decodeJSON(t, get(t, ctx, s.URL()+"/health"), http.StatusOK, &health)
	if health["status"] != "ok" {
		t.Errorf("health %v", health)
	}
	var list struct {
		Object string                       `json:"object"`
		Data   []map[string]json.RawMessage `json:"data"`
	}
	decodeJSON(t, get(t, ctx, s.URL()+"/v1/models"), http.StatusOK, &list)
	if list.Object != "list" || len(list.Data) != 1 || string(list.Data[0]["id"]) != `"mlx-community/Qwen3-4B-4bit"` ||
		list.Data[0]["created"] == nil || list.Data[0]["owned_by"] != nil {
		t.Errorf("models %+v", list)
	}
}
