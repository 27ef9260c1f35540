package fakemodel

import (
	"fmt"
	"net/http"
	"time"
)

// The mlx_lm.server dialect of POST /v1/chat/completions (Config.MLX), as
// mlx_lm/server.py writes it: "role":"assistant" in every
// delta and no separate role chunk, content only when non-empty, reasoning
// in delta.reasoning, each tool call whole in one chunk with its arguments
// as a JSON string, finish_reason "tool_calls" after a tool call, usage only
// with stream_options.include_usage and then in a last event whose object is
// "chat.completion" with no choices, ": keepalive N/M" comments before the
// first chunk, errors as {"error":"<string>"}, CORS headers, and a required
// Content-Length.

// mlxFingerprint stands in for mlx's "<version>-<mlx version>-<platform>-<gpu>".
const mlxFingerprint = "fakemodel-mlx"

func (s *Server) handleMLX(w http.ResponseWriter, r *http.Request) {
	setCORS(w.Header())
	if r.Header.Get("Content-Length") == "" {
		writeJSON(w, http.StatusLengthRequired, mlxError{"Content-Length header is required"})
		return
	}
	s.serveModel(w, r, &mlxDialect{})
}

func setCORS(h http.Header) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "*")
	h.Set("Access-Control-Allow-Headers", "*")
}

type mlxDialect struct {
	includeUsage bool
}

type mlxError struct {
	Error string `json:"error"`
}

func (d *mlxDialect) parse(body []byte) (Request, *Reply, error) {
	req, includeUsage, aux, err := parseOpenAI(body)
	d.includeUsage = includeUsage
	return req, aux, err
}

// toolID makes a UUID, as mlx does (str(uuid.uuid4())).
func (*mlxDialect) toolID(n int64) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// fail answers {"error": msg}. mlx has no error types; errType is ignored.
func (*mlxDialect) fail(w http.ResponseWriter, status int, _, msg string) {
	writeJSON(w, status, mlxError{errorMessage(status, msg)})
}

func (*mlxDialect) completionID(p *plan) string {
	return fmt.Sprintf("chatcmpl-00000000-0000-4000-8000-%012d", p.serial)
}

func (d *mlxDialect) whole(w http.ResponseWriter, req Request, p *plan) {
	msg := &openaiMessage{Role: "assistant", Reasoning: p.Thinking}
	if p.Text != "" {
		msg.Content = ptr(p.Text)
	}
	for _, t := range p.tools {
		msg.ToolCalls = append(msg.ToolCalls, openaiCall(nil, t.id, t.name, t.args))
	}
	writeJSON(w, http.StatusOK, openaiChunk{
		ID: d.completionID(p), SystemFingerprint: mlxFingerprint, Object: "chat.completion",
		Created: time.Now().Unix(), Model: req.Model,
		Choices: []openaiChoice{{Message: msg, FinishReason: ptr(p.stopReason(DialectOpenAI, "tool_calls", "stop"))}},
		Usage:   openaiUsageOf(p.usage),
	})
}

func (d *mlxDialect) stream(st *stream, req Request, p *plan) {
	if !st.open("text/event-stream") {
		return
	}
	created := time.Now().Unix()
	chunk := func(delta openaiDelta, finish *string) []byte {
		delta.Role = "assistant"
		return sseData(openaiChunk{
			ID: d.completionID(p), SystemFingerprint: mlxFingerprint, Object: "chat.completion.chunk",
			Created: created, Model: req.Model,
			Choices: []openaiChoice{{Delta: &delta, FinishReason: finish}},
		})
	}
	// Prompt processing progress, as mlx reports it for long prompts.
	total := p.usage.Input + p.usage.CacheRead
	for _, done := range []int{total / 2, total} {
		if !st.send(fmt.Appendf(nil, ": keepalive %d/%d\n\n", done, total)) {
			return
		}
	}
	for _, c := range p.thinking {
		if !st.content(chunk(openaiDelta{Reasoning: c}, nil)) {
			return
		}
	}
	for _, c := range p.text {
		if !st.content(chunk(openaiDelta{Content: ptr(c)}, nil)) {
			return
		}
	}
	if p.MidStreamError != "" {
		if st.hangPoint() {
			st.send(sseData(mlxError{p.MidStreamError}))
		}
		return
	}
	for i, t := range p.tools {
		call := openaiCall(ptr(i), t.id, t.name, t.args)
		if !st.content(chunk(openaiDelta{ToolCalls: []openaiToolCall{call}}, nil)) {
			return
		}
	}
	if !st.hangPoint() ||
		!st.send(chunk(openaiDelta{}, ptr(p.stopReason(DialectOpenAI, "tool_calls", "stop")))) {
		return
	}
	if d.includeUsage {
		usage := openaiChunk{
			ID: d.completionID(p), SystemFingerprint: mlxFingerprint, Object: "chat.completion",
			Created: created, Model: req.Model, Choices: []openaiChoice{}, Usage: openaiUsageOf(p.usage),
		}
		if !st.send(sseData(usage)) {
			return
		}
	}
	st.send([]byte(sseDone))
}
