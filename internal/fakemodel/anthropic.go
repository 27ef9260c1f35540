package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The Anthropic Messages API, POST /v1/messages (Claude Code adds
// ?beta=true), as Claude Code 2.1.197 uses it: always SSE when stream is
// true, a plain message otherwise.

func (s *Server) handleAnthropic(w http.ResponseWriter, r *http.Request) {
	s.serveModel(w, r, anthropicDialect{})
}

type anthropicDialect struct{}

// anthropicSignature is the signature sent for every thinking block
// (base64 of "fakesig").
const anthropicSignature = "ZmFrZXNpZw=="

type anthropicRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// anthropicInBlock holds the fields of the request content blocks that
// matter here, whatever their type.
type anthropicInBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

func (anthropicDialect) parse(body []byte) (Request, *Reply, error) {
	var in anthropicRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return Request{}, nil, err
	}
	req := Request{Dialect: DialectAnthropic, Model: in.Model, Stream: in.Stream}
	for _, t := range in.Tools {
		req.Tools = append(req.Tools, t.Name)
	}
	toolNames := map[string]string{} // tool_use id -> name
	var userTexts []string
	for i, m := range in.Messages {
		blocks, err := anthropicBlocks(m.Content)
		if err != nil {
			return Request{}, nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		switch m.Role {
		case "assistant":
			for _, b := range blocks {
				if b.Type == "tool_use" {
					toolNames[b.ID] = b.Name
				}
			}
		case "user":
			req.UserText, req.ToolResults = "", nil
			for _, b := range blocks {
				switch b.Type {
				case "text":
					req.UserText = b.Text
					userTexts = append(userTexts, b.Text)
				case "tool_result":
					req.ToolResults = append(req.ToolResults, ToolResult{
						ID:      b.ToolUseID,
						Name:    toolNames[b.ToolUseID],
						Content: anthropicResultText(b.Content),
						IsError: b.IsError,
					})
				}
			}
		}
	}
	return req, auxTitle(userTexts), nil
}

// anthropicBlocks decodes message content, a string or a list of blocks.
func anthropicBlocks(content json.RawMessage) ([]anthropicInBlock, error) {
	content = bytes.TrimSpace(content)
	switch {
	case len(content) == 0 || string(content) == "null":
		return nil, nil
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return nil, err
		}
		return []anthropicInBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []anthropicInBlock
	err := json.Unmarshal(content, &blocks)
	return blocks, err
}

// anthropicResultText is the text of a tool_result's content: the string,
// or its text blocks joined by newlines.
func anthropicResultText(content json.RawMessage) string {
	blocks, err := anthropicBlocks(content)
	if err != nil {
		return string(content)
	}
	var texts []string
	for _, b := range blocks {
		if b.Type == "text" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n")
}

func (anthropicDialect) toolID(n int64) string { return fmt.Sprintf("toolu_fake%06d", n) }

type anthropicError struct {
	Type  string             `json:"type"` // "error"
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func (anthropicDialect) fail(w http.ResponseWriter, status int, errType, msg string) {
	if errType == "" {
		errType = anthropicErrorType(status)
	}
	writeJSON(w, status, anthropicError{"error", anthropicErrorBody{errType, errorMessage(status, msg)}})
}

func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

type anthropicMessage struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"` // "message"
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

func anthropicUsageOf(u Usage) anthropicUsage {
	return anthropicUsage{u.Input, u.Output, u.CacheCreation, u.CacheRead}
}

// Content blocks, as sent in content_block_start and non-streaming replies.
type (
	anthropicThinking struct {
		Type      string `json:"type"` // "thinking"
		Thinking  string `json:"thinking"`
		Signature string `json:"signature"`
	}
	anthropicText struct {
		Type string `json:"type"` // "text"
		Text string `json:"text"`
	}
	anthropicToolUse struct {
		Type  string          `json:"type"` // "tool_use"
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
)

// Stream events.
type (
	anthropicTypeOnly struct {
		Type string `json:"type"` // "ping", "message_stop"
	}
	anthropicMessageStart struct {
		Type    string           `json:"type"`
		Message anthropicMessage `json:"message"`
	}
	anthropicBlockStart struct {
		Type         string `json:"type"`
		Index        int    `json:"index"`
		ContentBlock any    `json:"content_block"`
	}
	anthropicBlockDelta struct {
		Type  string         `json:"type"`
		Index int            `json:"index"`
		Delta anthropicDelta `json:"delta"`
	}
	anthropicDelta struct {
		Type        string `json:"type"`
		Text        string `json:"text,omitempty"`
		Thinking    string `json:"thinking,omitempty"`
		Signature   string `json:"signature,omitempty"`
		PartialJSON string `json:"partial_json,omitempty"`
	}
	anthropicBlockStop struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	anthropicMessageDelta struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage anthropicUsage `json:"usage"`
	}
)

func (anthropicDialect) messageID(p *plan) string { return fmt.Sprintf("msg_fake%06d", p.serial) }

func (d anthropicDialect) whole(w http.ResponseWriter, req Request, p *plan) {
	stop := p.stopReason(DialectAnthropic, "tool_use", "end_turn")
	msg := anthropicMessage{
		ID: d.messageID(p), Type: "message", Role: "assistant", Model: req.Model,
		Content: []any{}, StopReason: &stop, Usage: anthropicUsageOf(p.usage),
	}
	if p.Thinking != "" {
		msg.Content = append(msg.Content, anthropicThinking{"thinking", p.Thinking, anthropicSignature})
	}
	if p.Text != "" {
		msg.Content = append(msg.Content, anthropicText{"text", p.Text})
	}
	for _, t := range p.tools {
		msg.Content = append(msg.Content, anthropicToolUse{"tool_use", t.id, t.name, json.RawMessage(t.args)})
	}
	writeJSON(w, http.StatusOK, msg)
}

func (d anthropicDialect) stream(st *stream, req Request, p *plan) {
	if !st.open("text/event-stream; charset=utf-8") {
		return
	}
	start := anthropicUsageOf(p.usage)
	start.OutputTokens = 1
	msg := anthropicMessage{
		ID: d.messageID(p), Type: "message", Role: "assistant", Model: req.Model,
		Content: []any{}, Usage: start,
	}
	if !st.send(sseEvent("message_start", anthropicMessageStart{"message_start", msg})) ||
		!st.send(sseEvent("ping", anthropicTypeOnly{"ping"})) {
		return
	}

	index := 0
	block := func(contentBlock any, deltas []anthropicDelta) bool {
		if !st.send(sseEvent("content_block_start", anthropicBlockStart{"content_block_start", index, contentBlock})) {
			return false
		}
		for _, delta := range deltas {
			if !st.content(sseEvent("content_block_delta", anthropicBlockDelta{"content_block_delta", index, delta})) {
				return false
			}
		}
		index++
		return st.send(sseEvent("content_block_stop", anthropicBlockStop{"content_block_stop", index - 1}))
	}

	if len(p.thinking) > 0 {
		var deltas []anthropicDelta
		for _, c := range p.thinking {
			deltas = append(deltas, anthropicDelta{Type: "thinking_delta", Thinking: c})
		}
		deltas = append(deltas, anthropicDelta{Type: "signature_delta", Signature: anthropicSignature})
		if !block(anthropicThinking{Type: "thinking"}, deltas) {
			return
		}
	}
	if len(p.text) > 0 {
		var deltas []anthropicDelta
		for _, c := range p.text {
			deltas = append(deltas, anthropicDelta{Type: "text_delta", Text: c})
		}
		if !block(anthropicText{Type: "text"}, deltas) {
			return
		}
	}
	if p.MidStreamError != "" {
		errType := p.ErrorType
		if errType == "" {
			errType = "api_error"
		}
		if st.hangPoint() {
			st.send(sseEvent("error", anthropicError{"error", anthropicErrorBody{errType, p.MidStreamError}}))
		}
		return
	}
	for _, t := range p.tools {
		var deltas []anthropicDelta
		for _, part := range t.argParts {
			deltas = append(deltas, anthropicDelta{Type: "input_json_delta", PartialJSON: part})
		}
		if !block(anthropicToolUse{"tool_use", t.id, t.name, json.RawMessage("{}")}, deltas) {
			return
		}
	}
	if !st.hangPoint() {
		return
	}
	end := anthropicMessageDelta{Type: "message_delta", Usage: anthropicUsageOf(p.usage)}
	end.Delta.StopReason = p.stopReason(DialectAnthropic, "tool_use", "end_turn")
	if st.send(sseEvent("message_delta", end)) {
		st.send(sseEvent("message_stop", anthropicTypeOnly{"message_stop"}))
	}
}
