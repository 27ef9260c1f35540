package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OpenAI chat completions, POST /v1/chat/completions (also
// /chat/completions), as opencode's @ai-sdk/openai-compatible provider and
// the openai clients read it: SSE "data:" chunks ending in [DONE], an
// initial role chunk, reasoning in delta.reasoning_content and tool call
// arguments in fragments. With Config.MLX the same endpoint speaks the
// mlx_lm.server dialect instead (mlx.go).

func (s *Server) handleOpenAI(w http.ResponseWriter, r *http.Request) {
	if s.cfg.MLX {
		s.handleMLX(w, r)
		return
	}
	s.serveModel(w, r, &openaiDialect{})
}

// handleOpenAIModels lists Config.Models in the shape of GET /v1/models.
func (s *Server) handleOpenAIModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by,omitempty"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	if s.cfg.MLX {
		setCORS(w.Header())
	}
	for _, name := range s.cfg.Models {
		m := model{ID: name, Object: "model", Created: time.Now().Unix()}
		if !s.cfg.MLX {
			m.OwnedBy = "fakemodel" // mlx lists no owner
		}
		list.Data = append(list.Data, m)
	}
	writeJSON(w, http.StatusOK, list)
}

// openaiDialect serves one request; parse keeps the stream options the
// rendering needs.
type openaiDialect struct {
	includeUsage bool
}

type openaiRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tool_calls"`
		ToolCallID string `json:"tool_call_id"`
		Name       string `json:"name"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

// parseOpenAI decodes a chat completions request; the mlx dialect shares
// it.
func parseOpenAI(body []byte) (req Request, includeUsage bool, aux *Reply, err error) {
	var in openaiRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return Request{}, false, nil, err
	}
	req = Request{Dialect: DialectOpenAI, Model: in.Model, Stream: in.Stream}
	for _, t := range in.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	toolNames := map[string]string{} // tool call id -> name
	var userTexts []string
	for i, m := range in.Messages {
		texts, err := openaiTexts(m.Content)
		if err != nil {
			return Request{}, false, nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		switch m.Role {
		case "user":
			req.UserText = ""
			if len(texts) > 0 {
				req.UserText = texts[len(texts)-1]
			}
			userTexts = append(userTexts, texts...)
		case "assistant":
			req.ToolResults = nil // only results after the last assistant turn count
			for _, tc := range m.ToolCalls {
				toolNames[tc.ID] = tc.Function.Name
			}
		case "tool":
			name := m.Name
			if n, ok := toolNames[m.ToolCallID]; ok {
				name = n
			}
			req.ToolResults = append(req.ToolResults, ToolResult{
				ID: m.ToolCallID, Name: name, Content: strings.Join(texts, "\n"),
			})
		}
	}
	return req, in.StreamOptions != nil && in.StreamOptions.IncludeUsage, auxTitle(userTexts), nil
}

// openaiTexts returns the text parts of message content: a string, null or
// a list of parts.
func openaiTexts(content json.RawMessage) ([]string, error) {
	content = bytes.TrimSpace(content)
	switch {
	case len(content) == 0 || string(content) == "null":
		return nil, nil
	case content[0] == '"':
		var s string
		err := json.Unmarshal(content, &s)
		return []string{s}, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(content, &parts); err != nil {
		return nil, err
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return texts, nil
}

func (d *openaiDialect) parse(body []byte) (Request, *Reply, error) {
	req, includeUsage, aux, err := parseOpenAI(body)
	d.includeUsage = includeUsage
	return req, aux, err
}

func (*openaiDialect) toolID(n int64) string { return fmt.Sprintf("call_fake%06d", n) }

type openaiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func newOpenAIError(status int, errType, msg string) openaiError {
	if errType == "" {
		switch {
		case status == http.StatusUnauthorized:
			errType = "authentication_error"
		case status == http.StatusForbidden:
			errType = "permission_error"
		case status == http.StatusTooManyRequests:
			errType = "rate_limit_error"
		case status >= 500:
			errType = "server_error"
		default:
			errType = "invalid_request_error"
		}
	}
	var e openaiError
	e.Error.Message, e.Error.Type = errorMessage(status, msg), errType
	return e
}

func (*openaiDialect) fail(w http.ResponseWriter, status int, errType, msg string) {
	writeJSON(w, status, newOpenAIError(status, errType, msg))
}

// Wire types shared with the mlx dialect.
type (
	openaiChunk struct {
		ID                string         `json:"id"`
		SystemFingerprint string         `json:"system_fingerprint,omitempty"`
		Object            string         `json:"object"`
		Created           int64          `json:"created"`
		Model             string         `json:"model"`
		Choices           []openaiChoice `json:"choices"`
		Usage             *openaiUsage   `json:"usage,omitempty"`
	}
	openaiChoice struct {
		Index        int            `json:"index"`
		Delta        *openaiDelta   `json:"delta,omitempty"`
		Message      *openaiMessage `json:"message,omitempty"`
		FinishReason *string        `json:"finish_reason"`
	}
	openaiDelta struct {
		Role             string           `json:"role,omitempty"`
		Content          *string          `json:"content,omitempty"`
		ReasoningContent string           `json:"reasoning_content,omitempty"`
		Reasoning        string           `json:"reasoning,omitempty"`
		ToolCalls        []openaiToolCall `json:"tool_calls,omitempty"`
	}
	openaiMessage struct {
		Role             string           `json:"role"`
		Content          *string          `json:"content"` // null when there is no text
		ReasoningContent string           `json:"reasoning_content,omitempty"`
		Reasoning        string           `json:"reasoning,omitempty"`
		ToolCalls        []openaiToolCall `json:"tool_calls,omitempty"`
	}
	openaiToolCall struct {
		Index    *int   `json:"index,omitempty"` // in streams only
		ID       string `json:"id,omitempty"`
		Type     string `json:"type,omitempty"`
		Function struct {
			Name      string `json:"name,omitempty"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	openaiUsage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
)

func openaiUsageOf(u Usage) *openaiUsage {
	prompt := u.Input + u.CacheRead
	out := &openaiUsage{PromptTokens: prompt, CompletionTokens: u.Output, TotalTokens: prompt + u.Output}
	out.PromptTokensDetails.CachedTokens = u.CacheRead
	return out
}

// openaiCall is a tool call in OpenAI's shape; index is nil outside
// streams.
func openaiCall(index *int, id, name, args string) openaiToolCall {
	tc := openaiToolCall{Index: index, ID: id}
	if id != "" {
		tc.Type = "function"
	}
	tc.Function.Name, tc.Function.Arguments = name, args
	return tc
}

func ptr[T any](v T) *T { return &v }

func (*openaiDialect) completionID(p *plan) string { return fmt.Sprintf("chatcmpl-fake%06d", p.serial) }

func (d *openaiDialect) whole(w http.ResponseWriter, req Request, p *plan) {
	msg := &openaiMessage{Role: "assistant", ReasoningContent: p.Thinking}
	if p.Text != "" {
		msg.Content = ptr(p.Text)
	}
	for _, t := range p.tools {
		msg.ToolCalls = append(msg.ToolCalls, openaiCall(nil, t.id, t.name, t.args))
	}
	writeJSON(w, http.StatusOK, openaiChunk{
		ID: d.completionID(p), Object: "chat.completion", Created: time.Now().Unix(), Model: req.Model,
		Choices: []openaiChoice{{
			Message:      msg,
			FinishReason: ptr(p.stopReason(DialectOpenAI, "tool_calls", "stop")),
		}},
		Usage: openaiUsageOf(p.usage),
	})
}

func (d *openaiDialect) stream(st *stream, req Request, p *plan) {
	if !st.open("text/event-stream") {
		return
	}
	created := time.Now().Unix()
	chunk := func(delta *openaiDelta, finish *string) []byte {
		return sseData(openaiChunk{
			ID: d.completionID(p), Object: "chat.completion.chunk", Created: created, Model: req.Model,
			Choices: []openaiChoice{{Delta: delta, FinishReason: finish}},
		})
	}
	if !st.send(chunk(&openaiDelta{Role: "assistant", Content: ptr("")}, nil)) {
		return
	}
	for _, c := range p.thinking {
		if !st.content(chunk(&openaiDelta{ReasoningContent: c}, nil)) {
			return
		}
	}
	for _, c := range p.text {
		if !st.content(chunk(&openaiDelta{Content: ptr(c)}, nil)) {
			return
		}
	}
	if p.MidStreamError != "" {
		if st.hangPoint() {
			st.send(sseData(newOpenAIError(http.StatusInternalServerError, p.ErrorType, p.MidStreamError)))
		}
		return
	}
	for i, t := range p.tools {
		first := openaiCall(ptr(i), t.id, t.name, "")
		if !st.content(chunk(&openaiDelta{ToolCalls: []openaiToolCall{first}}, nil)) {
			return
		}
		for _, part := range t.argParts {
			if !st.content(chunk(&openaiDelta{ToolCalls: []openaiToolCall{openaiCall(ptr(i), "", "", part)}}, nil)) {
				return
			}
		}
	}
	if !st.hangPoint() ||
		!st.send(chunk(&openaiDelta{}, ptr(p.stopReason(DialectOpenAI, "tool_calls", "stop")))) {
		return
	}
	if d.includeUsage {
		usage := openaiChunk{
			ID: d.completionID(p), Object: "chat.completion.chunk", Created: created, Model: req.Model,
			Choices: []openaiChoice{}, Usage: openaiUsageOf(p.usage),
		}
		if !st.send(sseData(usage)) {
			return
		}
	}
	st.send([]byte(sseDone))
}
