package fakemodel_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

func geminiURL(s *fakemodel.Server, model string, stream bool) string {
	if stream {
		return s.URL() + "/v1beta/models/" + model + ":streamGenerateContent?alt=sse"
	}
	return s.URL() + "/v1beta/models/" + model + ":generateContent"
}

func geminiBody(text string) map[string]any {
	return map[string]any{
		"contents": []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": text}}}},
		"tools":    []any{map[string]any{"functionDeclarations": []any{map[string]any{"name": "run_shell_command"}}}},
	}
}

type geminiResponse struct {
	Candidates []struct {
		Content struct {
			Role  string `json:"role"`
			Parts []struct {
				Text         *string `json:"text"`
				Thought      bool    `json:"thought"`
				FunctionCall *struct {
					ID   string          `json:"id"`
					Name string          `json:"name"`
					Args json.RawMessage `json:"args"`
				} `json:"functionCall"`
			} `json:"parts"`
		} `json:"content"`
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	UsageMetadata *struct {
		PromptTokenCount     int `json:"promptTokenCount"`
		CandidatesTokenCount int `json:"candidatesTokenCount"`
		TotalTokenCount      int `json:"totalTokenCount"`
	} `json:"usageMetadata"`
	ModelVersion string          `json:"modelVersion"`
	Error        json.RawMessage `json:"error"`
}

// add accumulates r into d as gemini-cli does.
func (r geminiResponse) add(t *testing.T, d *decoded) {
	t.Helper()
	if r.Error != nil {
		d.Error = string(r.Error)
		return
	}
	if len(r.Candidates) != 1 || r.Candidates[0].Content.Role != "model" || len(r.Candidates[0].Content.Parts) == 0 {
		t.Fatalf("response without one model candidate with parts: %+v", r)
	}
	for _, p := range r.Candidates[0].Content.Parts {
		switch {
		case p.FunctionCall != nil:
			d.Calls = append(d.Calls, call{ID: p.FunctionCall.ID, Name: p.FunctionCall.Name, Args: string(p.FunctionCall.Args)})
		case p.Text != nil && p.Thought:
			d.Thinking += *p.Text
		case p.Text != nil:
			d.Text += *p.Text
		}
	}
	if f := r.Candidates[0].FinishReason; f != "" {
		d.Stop, d.Done = f, true
	}
	if u := r.UsageMetadata; u != nil {
		d.Input, d.Output = u.PromptTokenCount, u.CandidatesTokenCount
	}
}

func decodeGemini(t *testing.T, body io.Reader) decoded {
	t.Helper()
	var d decoded
	for _, ev := range readSSE(t, body) {
		if d.Done || d.Error != "" {
			t.Fatalf("event after the end: %+v", ev)
		}
		var r geminiResponse
		if ev.Event != "" {
			t.Fatalf("named event %+v", ev)
		}
		if err := json.Unmarshal([]byte(ev.Data), &r); err != nil {
			t.Fatalf("event %q: %v", ev.Data, err)
		}
		r.add(t, &d)
	}
	return d
}

func TestGeminiStream(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{
		Thinking:  "considering",
		Text:      "I will run it.",
		ToolCalls: []fakemodel.ToolCall{{Name: "run_shell_command", Input: json.RawMessage(`{"command":"echo hi-gemini"}`)}},
		Usage:     fakemodel.Usage{Input: 431, Output: 40},
	})
	resp := post(t, testContext(t), geminiURL(s, "gemini-3.8-flash", true), geminiBody("TOOL_BASH: echo hi-gemini"))
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(raw, []byte("data: {")) || !bytes.HasSuffix(raw, []byte("}\r\n\r\n")) ||
		bytes.Count(raw, []byte("\r\n\r\n")) < 3 {
		t.Fatalf("status %d, body %q", resp.StatusCode, raw)
	}
	d := decodeGemini(t, bytes.NewReader(raw))
	if d.Thinking != "considering" || d.Text != "I will run it." || d.Stop != "STOP" || !d.Done {
		t.Errorf("decoded %+v", d)
	}
	// Like the real API, calls come whole and without ids.
	if len(d.Calls) != 1 || d.Calls[0].Name != "run_shell_command" || d.Calls[0].ID != "" ||
		compact(t, d.Calls[0].Args) != `{"command":"echo hi-gemini"}` {
		t.Errorf("calls %+v", d.Calls)
	}
	if d.Input != 431 || d.Output != 40 {
		t.Errorf("usage %d/%d", d.Input, d.Output)
	}
	if r := s.Requests(); len(r) != 1 || r[0].Model != "gemini-3.8-flash" || !r[0].Stream || r[0].RawQuery != "alt=sse" {
		t.Errorf("requests %+v", r)
	}
}

func TestGeminiGenerateContent(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(fakemodel.Reply{Thinking: "a", Text: "b", StopReason: "max_tokens"})
	var r geminiResponse
	decodeJSON(t, post(t, testContext(t), geminiURL(s, "gemini-x", false), geminiBody("hi")), http.StatusOK, &r)
	var d decoded
	r.add(t, &d)
	if d.Thinking != "a" || d.Text != "b" || d.Stop != "MAX_TOKENS" || r.ModelVersion != "gemini-x" || r.UsageMetadata == nil {
		t.Errorf("decoded %+v from %+v", d, r)
	}
}

func TestGeminiErrors(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{Status: http.StatusTooManyRequests},
		fakemodel.Reply{Text: "partial", MidStreamError: "backend died"},
	)
	ctx := testContext(t)
	var e struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	decodeJSON(t, post(t, ctx, geminiURL(s, "g", true), geminiBody("hi")), http.StatusTooManyRequests, &e)
	if e.Error.Code != 429 || e.Error.Status != "RESOURCE_EXHAUSTED" || e.Error.Message == "" {
		t.Errorf("error %+v", e)
	}
	d := decodeGemini(t, post(t, ctx, geminiURL(s, "g", true), geminiBody("hi")).Body)
	if d.Text != "partial" || d.Done || json.Unmarshal([]byte(d.Error), &e.Error) != nil ||
		e.Error.Code != 500 || e.Error.Message != "backend died" || e.Error.Status != "INTERNAL" {
		t.Errorf("decoded %+v, error %+v", d, e)
	}
	// Streaming needs alt=sse; other methods are not served.
	decodeJSON(t, post(t, ctx, s.URL()+"/v1beta/models/g:streamGenerateContent", geminiBody("hi")), http.StatusBadRequest, &e)
	decodeJSON(t, post(t, ctx, s.URL()+"/v1beta/models/g:countTokens", geminiBody("hi")), http.StatusNotFound, &e)
	if n := len(s.Requests()); n != 2 {
		t.Errorf("%d requests recorded, want 2", n)
	}
}

// TestGeminiCapturedRequests replays what gemini-cli 0.61.0 sent: the
// router's generateContent call, the main streamed call, and the call that
// carries the shell command's result.
func TestGeminiCapturedRequests(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	s.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "run_shell_command",
			Input: json.RawMessage(`{"command":"echo hi-gemini","description":"run a command for the test"}`)}}},
		fakemodel.Reply{Text: "tool said: hi-gemini"},
	)
	ctx := testContext(t)
	caps := loadCaptured(t, "gemini-requests.sample.jsonl")

	// The router is answered from its schema, without the script.
	var r geminiResponse
	decodeJSON(t, replay(t, ctx, s, caps[0]), http.StatusOK, &r)
	var d decoded
	r.add(t, &d)
	var route map[string]any
	if err := json.Unmarshal([]byte(d.Text), &route); err != nil {
		t.Fatalf("router answer %q: %v", d.Text, err)
	}
	if want := map[string]any{"complexity_reasoning": "simple", "complexity_score": 1.0}; !reflect.DeepEqual(route, want) {
		t.Errorf("router answer %v, want %v", route, want)
	}
	if d.Stop != "STOP" || s.Pending() != 2 || len(s.Requests()) != 0 {
		t.Errorf("router stop %q; %d pending, %d recorded", d.Stop, s.Pending(), len(s.Requests()))
	}

	if d := decodeGemini(t, replay(t, ctx, s, caps[1]).Body); len(d.Calls) != 1 || !d.Done {
		t.Errorf("reply 1: %+v", d)
	}
	if d := decodeGemini(t, replay(t, ctx, s, caps[2]).Body); d.Text != "tool said: hi-gemini" || !d.Done {
		t.Errorf("reply 2: %+v", d)
	}
	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests recorded", len(reqs))
	}
	if reqs[0].UserText != "TOOL_BASH: echo hi-gemini" || reqs[0].ToolResults != nil || reqs[0].Model != "gemini-3.8-flash" ||
		len(reqs[0].Tools) != 15 || reqs[0].Tools[8] != "run_shell_command" || reqs[0].Dialect != fakemodel.DialectGemini {
		t.Errorf("request 0: %+v", reqs[0])
	}
	want := []fakemodel.ToolResult{{
		ID: "run_shell_command_1795977886819_0", Name: "run_shell_command",
		Content: "<untrusted_context>\nOutput: hi-gemini\nProcess Group PGID: 16375\n</untrusted_context>",
	}}
	if reqs[1].UserText != "" || !reflect.DeepEqual(reqs[1].ToolResults, want) {
		t.Errorf("request 1: %q %+v", reqs[1].UserText, reqs[1].ToolResults)
	}
}

func TestGeminiSchemaValues(t *testing.T) {
	t.Parallel()
	s := fakemodel.Start(t, fakemodel.Config{})
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"reasoning":    map[string]any{"type": "string"},
			"next_speaker": map[string]any{"type": "string", "enum": []any{"user", "model"}},
			"score":        map[string]any{"type": "integer", "minimum": 5},
			"ok":           map[string]any{"type": "boolean"},
			"tags":         map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
		},
	}
	body := geminiBody("is it your turn?")
	body["generationConfig"] = map[string]any{"responseMimeType": "application/json", "responseJsonSchema": schema}
	var r geminiResponse
	decodeJSON(t, post(t, testContext(t), geminiURL(s, "flash-lite", false), body), http.StatusOK, &r)
	var got map[string]any
	if err := json.Unmarshal([]byte(*r.Candidates[0].Content.Parts[0].Text), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"reasoning": "simple", "next_speaker": "user", "score": 5.0, "ok": false, "tags": []any{"simple"}}
	if !reflect.DeepEqual(got, want) || len(s.Requests()) != 0 {
		t.Errorf("value %v, want %v", got, want)
	}
}
