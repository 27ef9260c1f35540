package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// openaiDialect talks to an OpenAI-compatible server (mlx_lm.server, vmlx
// and the like): POST /v1/chat/completions, answered as server-sent
// events. It reads both plain OpenAI streams (a role chunk first,
// reasoning_content, tool call arguments in fragments) and mlx's (the role
// in every delta, reasoning, each tool call whole, usage in a last
// "chat.completion" event, keep-alive comments, string errors).
type openaiDialect struct {
	host   string // base URL without /v1, e.g. http://127.0.0.1:8000
	client *http.Client
}

// newOpenAI makes the dialect for the OpenAI-compatible server at host, a
// base URL without /v1 such as http://127.0.0.1:8000.
func newOpenAI(host string) *openaiDialect {
	return &openaiDialect{host: strings.TrimRight(host, "/"), client: newModelClient()}
}

var _ dialect = (*openaiDialect)(nil)

type openaiRequest struct {
	Model         string          `json:"model"`
	Messages      []openaiMessage `json:"messages"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools []functionTool `json:"tools,omitempty"`
}

type openaiMessage struct {
	Role       string           `json:"role"`
	Content    string           `json:"content"`
	ToolCalls  []openaiToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
}

type openaiToolCall struct {
	Index    *int   `json:"index,omitempty"` // in streamed answers only
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"` // JSON text, or a fragment of it
	} `json:"function"`
}

// openaiChunk is one event of a streamed answer.
type openaiChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content          string           `json:"content"`
			ReasoningContent string           `json:"reasoning_content"` // OpenAI-compatible servers
			Reasoning        string           `json:"reasoning"`         // mlx
			ToolCalls        []openaiToolCall `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		CompletionTokens    int64 `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (d *openaiDialect) chat(ctx context.Context, req chatRequest, each func(delta) error) error {
	body, err := json.Marshal(openaiBody(req))
	if err != nil {
		return fmt.Errorf("openai: encoding the request: %w", err)
	}
	build := func(ctx context.Context) (*http.Request, error) {
		// A bytes.Reader body gives the request a Content-Length, which
		// mlx_lm.server requires.
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, d.host+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r.Header.Set("Content-Type", "application/json")
		return r, nil
	}
	read := func(body io.Reader, emit func(delta) error) error {
		return (&openaiStream{emit: emit}).read(body)
	}
	return postChat(ctx, d.client, "openai", build, read, each)
}

// openaiBody renders req in OpenAI's shape. An assistant's reasoning is
// not sent back: OpenAI-compatible servers take no reasoning in requests.
func openaiBody(req chatRequest) openaiRequest {
	out := openaiRequest{
		Model:    req.Model,
		Messages: make([]openaiMessage, 0, len(req.Messages)),
		Stream:   true,
		Tools:    functionTools(req.Tools),
	}
	out.StreamOptions.IncludeUsage = true
	for _, m := range req.Messages {
		om := openaiMessage{Role: m.Role, Content: m.Content}
		switch m.Role {
		case "assistant":
			for _, tc := range m.ToolCalls {
				call := openaiToolCall{ID: tc.ID, Type: "function"}
				call.Function.Name, call.Function.Arguments = tc.Name, string(objectOrEmpty(tc.Arguments))
				om.ToolCalls = append(om.ToolCalls, call)
			}
		case "tool":
			om.ToolCallID = m.ToolID
		}
		out.Messages = append(out.Messages, om)
	}
	return out
}

// openaiStream reads one streamed answer.
type openaiStream struct {
	emit     func(delta) error
	calls    []openaiToolCall // being accumulated, in order of arrival
	slots    map[int]int      // a call's stream index -> its place in calls
	stop     string           // the finish reason
	finished bool             // a finish reason arrived
	usage    *schemas.Usage
}

// read reads server-sent events until data: [DONE]. Comments (mlx's
// keep-alives) and the event, id and retry fields are ignored; any other
// line is an error.
func (s *openaiStream) read(body io.Reader) error {
	sc := newLineScanner(body)
	var data []byte // the data of the event being read
	pending := false
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if pending {
				done, err := s.event(data)
				if done || err != nil {
					return err
				}
				data, pending = data[:0], false
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if pending {
				data = append(data, '\n')
			}
			data, pending = append(data, value...), true
		case "event", "id", "retry":
		default:
			return fmt.Errorf("openai: unreadable line %q", clipForError(line))
		}
	}
	if err := sc.Err(); err != nil {
		return streamEnd("openai", err)
	}
	if pending {
		if done, err := s.event(data); done || err != nil {
			return err
		}
	}
	if s.finished {
		// The server closed the stream after the answer's end without
		// [DONE]; nothing is missing but, maybe, the usage.
		return s.end()
	}
	return streamEnd("openai", nil)
}

// event handles the data of one event and reports whether it ended the
// answer.
func (s *openaiStream) event(data []byte) (bool, error) {
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		return true, s.end()
	}
	var c openaiChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return false, fmt.Errorf("openai: unreadable event %q: %w", clipForError(data), err)
	}
	if jsonPresent(c.Error) {
		return false, fmt.Errorf("openai: %s", serverErrorText(c.Error))
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // only one choice is asked for
		}
		thinking := ch.Delta.ReasoningContent
		if thinking == "" {
			thinking = ch.Delta.Reasoning
		}
		if thinking != "" {
			if err := s.emit(delta{Thinking: thinking}); err != nil {
				return false, err
			}
		}
		if ch.Delta.Content != "" {
			if err := s.emit(delta{Text: ch.Delta.Content}); err != nil {
				return false, err
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			s.addCall(tc)
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.stop, s.finished = *ch.FinishReason, true
			if err := s.flushCalls(); err != nil {
				return false, err
			}
		}
	}
	if c.Usage != nil {
		s.usage = &schemas.Usage{
			InputTokens:     c.Usage.PromptTokens,
			OutputTokens:    c.Usage.CompletionTokens,
			CacheReadTokens: c.Usage.PromptTokensDetails.CachedTokens,
			CostUSD:         schemas.Cost(0),
		}
	}
	return false, nil
}

// addCall adds a tool call, or a fragment of one, to those being
// accumulated. Fragments of a call share its index; a call without an
// index is a new one if it has an id, else a fragment of the last.
func (s *openaiStream) addCall(tc openaiToolCall) {
	if s.slots == nil {
		s.slots = map[int]int{}
	}
	slot := -1
	switch {
	case tc.Index != nil:
		if i, ok := s.slots[*tc.Index]; ok {
			slot = i
		} else {
			s.slots[*tc.Index] = len(s.calls)
		}
	case tc.ID == "" && len(s.calls) > 0:
		slot = len(s.calls) - 1
	}
	if slot < 0 {
		s.calls = append(s.calls, tc)
		return
	}
	c := &s.calls[slot]
	if c.ID == "" {
		c.ID = tc.ID
	}
	if c.Function.Name == "" {
		c.Function.Name = tc.Function.Name
	}
	c.Function.Arguments += tc.Function.Arguments
}

// flushCalls delivers the accumulated tool calls, whole.
func (s *openaiStream) flushCalls() error {
	if len(s.calls) == 0 {
		return nil
	}
	calls := make([]toolCall, 0, len(s.calls))
	for _, c := range s.calls {
		calls = append(calls, toolCall{ID: c.ID, Name: c.Function.Name, Arguments: argsObject(c.Function.Arguments)})
	}
	s.calls, s.slots = nil, nil
	return s.emit(delta{ToolCalls: calls})
}

// end delivers what is left and the last delta.
func (s *openaiStream) end() error {
	if err := s.flushCalls(); err != nil {
		return err
	}
	return s.emit(delta{Done: true, Stop: s.stop, Usage: s.usage})
}
