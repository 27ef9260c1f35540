package fakemodel

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Ollama's API (as ollama/ollama's api/types.go and
// server/routes.go define it): POST /api/chat streams NDJSON by default, one
// ChatResponse per line, thinking in message.thinking, each tool call whole
// with its arguments as an object, and a final done chunk with done_reason
// "stop" (even after tool calls) and the counts and durations. Errors are
// {"error":"msg"}: with a status before streaming, as one more line during
// it. GET /api/tags, POST /api/show and GET /api/version describe the
// served models.

// ollamaVersion is what GET /api/version reports.
const ollamaVersion = "0.13.0"

func (s *Server) handleOllama(w http.ResponseWriter, r *http.Request) {
	s.serveModel(w, r, ollamaDialect{})
}

type ollamaDialect struct{}

type ollamaRequest struct {
	Model    string `json:"model"`
	Stream   *bool  `json:"stream"` // default true
	Messages []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolName   string `json:"tool_name"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

func (ollamaDialect) parse(body []byte) (Request, *Reply, error) {
	var in ollamaRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return Request{}, nil, err
	}
	req := Request{Dialect: DialectOllama, Model: in.Model, Stream: in.Stream == nil || *in.Stream}
	for _, t := range in.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	toolNames := map[string]string{} // tool call id -> name
	var userTexts []string
	for _, m := range in.Messages {
		switch m.Role {
		case "user":
			req.UserText = m.Content
			userTexts = append(userTexts, m.Content)
		case "assistant":
			req.ToolResults = nil // only results after the last assistant turn count
			for _, tc := range m.ToolCalls {
				toolNames[tc.ID] = tc.Function.Name
			}
		case "tool":
			name := m.ToolName
			if name == "" {
				name = toolNames[m.ToolCallID]
			}
			req.ToolResults = append(req.ToolResults, ToolResult{ID: m.ToolCallID, Name: name, Content: m.Content})
		}
	}
	return req, auxTitle(userTexts), nil
}

// toolID makes an id like Ollama's, "call_" and 8 lowercase alphanumerics.
func (ollamaDialect) toolID(n int64) string { return fmt.Sprintf("call_%08d", n%100_000_000) }

type ollamaError struct {
	Error string `json:"error"`
}

// fail answers {"error": msg}. Ollama has no error types; errType is
// ignored.
func (ollamaDialect) fail(w http.ResponseWriter, status int, _, msg string) {
	writeJSON(w, status, ollamaError{errorMessage(status, msg)})
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
}

type ollamaToolCall struct {
	ID       string `json:"id,omitempty"`
	Function struct {
		Index     int             `json:"index"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"` // an object, not a string
	} `json:"function"`
}

type ollamaResponse struct {
	Model              string        `json:"model"`
	CreatedAt          string        `json:"created_at"`
	Message            ollamaMessage `json:"message"`
	Done               bool          `json:"done"`
	DoneReason         string        `json:"done_reason,omitempty"`
	TotalDuration      int64         `json:"total_duration,omitempty"`
	LoadDuration       int64         `json:"load_duration,omitempty"`
	PromptEvalCount    int           `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64         `json:"prompt_eval_duration,omitempty"`
	EvalCount          int           `json:"eval_count,omitempty"`
	EvalDuration       int64         `json:"eval_duration,omitempty"`
}

func ollamaCalls(p *plan) []ollamaToolCall {
	var calls []ollamaToolCall
	for i, t := range p.tools {
		var tc ollamaToolCall
		tc.ID = t.id
		tc.Function.Index, tc.Function.Name, tc.Function.Arguments = i, t.name, json.RawMessage(t.args)
		calls = append(calls, tc)
	}
	return calls
}

func ollamaChunk(model string, msg ollamaMessage) ollamaResponse {
	msg.Role = "assistant"
	return ollamaResponse{Model: model, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano), Message: msg}
}

// done makes r the final response: done, with the reason, counts and
// made-up durations (1 ms to load, 0.1 ms per prompt token, 1 ms per
// output token).
func (r ollamaResponse) done(p *plan) ollamaResponse {
	r.Done = true
	r.DoneReason = p.stopReason(DialectOllama, "stop", "stop")
	r.LoadDuration = int64(time.Millisecond)
	r.PromptEvalCount = p.usage.Input
	r.PromptEvalDuration = int64(p.usage.Input) * int64(100*time.Microsecond)
	r.EvalCount = p.usage.Output
	r.EvalDuration = int64(p.usage.Output) * int64(time.Millisecond)
	r.TotalDuration = r.LoadDuration + r.PromptEvalDuration + r.EvalDuration
	return r
}

func (ollamaDialect) whole(w http.ResponseWriter, req Request, p *plan) {
	msg := ollamaMessage{Content: p.Text, Thinking: p.Thinking, ToolCalls: ollamaCalls(p)}
	writeJSON(w, http.StatusOK, ollamaChunk(req.Model, msg).done(p))
}

func ndjson(v any) []byte { return append(encodeJSON(v), '\n') }

func (ollamaDialect) stream(st *stream, req Request, p *plan) {
	if !st.open("application/x-ndjson") {
		return
	}
	for _, c := range p.thinking {
		if !st.content(ndjson(ollamaChunk(req.Model, ollamaMessage{Thinking: c}))) {
			return
		}
	}
	for _, c := range p.text {
		if !st.content(ndjson(ollamaChunk(req.Model, ollamaMessage{Content: c}))) {
			return
		}
	}
	if p.MidStreamError != "" {
		if st.hangPoint() {
			st.send(ndjson(ollamaError{p.MidStreamError}))
		}
		return
	}
	for _, call := range ollamaCalls(p) {
		msg := ollamaMessage{ToolCalls: []ollamaToolCall{call}}
		if !st.content(ndjson(ollamaChunk(req.Model, msg))) {
			return
		}
	}
	if st.hangPoint() {
		st.send(ndjson(ollamaChunk(req.Model, ollamaMessage{}).done(p)))
	}
}

// ollamaModel describes a served model in /api/tags and /api/show.
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

var fakeDetails = ollamaDetails{
	Format: "gguf", Family: "fake", Families: []string{"fake"},
	ParameterSize: "1B", QuantizationLevel: "Q4_0",
}

// modifiedAt is the fixed modification time of every served model.
const modifiedAt = "2026-01-01T00:00:00Z"

func (s *Server) handleOllamaTags(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		Name       string        `json:"name"`
		Model      string        `json:"model"`
		ModifiedAt string        `json:"modified_at"`
		Size       int64         `json:"size"`
		Digest     string        `json:"digest"`
		Details    ollamaDetails `json:"details"`
	}
	tags := struct {
		Models []model `json:"models"`
	}{Models: []model{}}
	for _, name := range s.cfg.Models {
		sum := sha256.Sum256([]byte(name))
		tags.Models = append(tags.Models, model{
			Name: name, Model: name, ModifiedAt: modifiedAt, Size: 1 << 30,
			Digest: hex.EncodeToString(sum[:]), Details: fakeDetails,
		})
	}
	writeJSON(w, http.StatusOK, tags)
}

// handleOllamaShow describes any model name, since /api/chat serves any.
func (s *Server) handleOllamaShow(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":    "",
		"parameters":   "",
		"template":     "{{ .Prompt }}",
		"details":      fakeDetails,
		"model_info":   map[string]any{"general.architecture": "fake", "fake.context_length": 131072},
		"capabilities": []string{"completion", "tools", "thinking"},
		"modified_at":  modifiedAt,
	})
}

func (s *Server) handleOllamaVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": ollamaVersion})
}
