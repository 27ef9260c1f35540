package fakemodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The Gemini API as gemini-cli 0.61.0 uses it:
// POST /v1beta/models/{model}:streamGenerateContent?alt=sse, whose SSE
// events are "data: {...}\r\n\r\n" GenerateContentResponses, and
// POST /v1beta/models/{model}:generateContent. The router's generateContent
// call, which asks for JSON matching a schema, is answered with a value
// built from the schema and does not take a scripted reply.

func (s *Server) handleGemini(w http.ResponseWriter, r *http.Request) {
	call := r.PathValue("call")
	i := strings.LastIndex(call, ":")
	if i < 0 {
		geminiFail(w, http.StatusNotFound, "", fmt.Sprintf("fakemodel: no method in %q", call))
		return
	}
	model, method := call[:i], call[i+1:]
	switch method {
	case "streamGenerateContent":
		if r.URL.Query().Get("alt") != "sse" {
			geminiFail(w, http.StatusBadRequest, "", "fakemodel: streamGenerateContent is served only with alt=sse")
			return
		}
		s.serveModel(w, r, &geminiDialect{model: model, streaming: true})
	case "generateContent":
		s.serveModel(w, r, &geminiDialect{model: model})
	default:
		geminiFail(w, http.StatusNotFound, "", fmt.Sprintf("fakemodel: method %q is not served", method))
	}
}

// geminiDialect serves one request; the model and whether it streams come
// from the URL.
type geminiDialect struct {
	model     string
	streaming bool
}

type geminiRequest struct {
	Contents []geminiContent `json:"contents"`
	Tools    []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
	GenerationConfig struct {
		ResponseMimeType   string          `json:"responseMimeType"`
		ResponseJSONSchema json.RawMessage `json:"responseJsonSchema"`
		ResponseSchema     json.RawMessage `json:"responseSchema"`
	} `json:"generationConfig"`
}

type geminiContent struct {
	Role  string       `json:"role"`
	Parts []geminiPart `json:"parts"`
}

// geminiPart is a Part, in requests and replies.
type geminiPart struct {
	Text             *string                 `json:"text,omitempty"`
	Thought          bool                    `json:"thought,omitempty"`
	FunctionCall     *geminiFunctionCall     `json:"functionCall,omitempty"`
	FunctionResponse *geminiFunctionResponse `json:"functionResponse,omitempty"`
}

type geminiFunctionCall struct {
	ID   string          `json:"id,omitempty"`
	Name string          `json:"name"`
	Args json.RawMessage `json:"args"`
}

type geminiFunctionResponse struct {
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Response json.RawMessage `json:"response"`
}

func (d *geminiDialect) parse(body []byte) (Request, *Reply, error) {
	var in geminiRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return Request{}, nil, err
	}
	req := Request{Dialect: DialectGemini, Model: d.model, Stream: d.streaming}
	for _, t := range in.Tools {
		for _, f := range t.FunctionDeclarations {
			req.Tools = append(req.Tools, f.Name)
		}
	}
	var userTexts []string
	for _, c := range in.Contents {
		if c.Role == "model" {
			continue // user turns: "user", no role, or "function" (older clients' results)
		}
		req.UserText, req.ToolResults = "", nil
		for _, part := range c.Parts {
			switch {
			case part.Text != nil && !part.Thought:
				req.UserText = *part.Text
				userTexts = append(userTexts, *part.Text)
			case part.FunctionResponse != nil:
				req.ToolResults = append(req.ToolResults, geminiToolResult(part.FunctionResponse))
			}
		}
	}
	gc := in.GenerationConfig
	schema := gc.ResponseJSONSchema
	if len(schema) == 0 {
		schema = gc.ResponseSchema
	}
	if !d.streaming && strings.HasPrefix(gc.ResponseMimeType, "application/json") && len(schema) > 0 {
		value, err := valueFromSchema(schema)
		if err != nil {
			return Request{}, nil, fmt.Errorf("generationConfig schema: %w", err)
		}
		return req, &Reply{Text: string(value)}, nil
	}
	return req, auxTitle(userTexts), nil
}

// geminiToolResult reads a functionResponse. gemini-cli sends
// {"output": "..."} or {"error": "..."}; anything else is kept as JSON.
func geminiToolResult(fr *geminiFunctionResponse) ToolResult {
	tr := ToolResult{ID: fr.ID, Name: fr.Name, Content: string(fr.Response)}
	var resp map[string]json.RawMessage
	if json.Unmarshal(fr.Response, &resp) != nil {
		return tr
	}
	var s string
	if json.Unmarshal(resp["output"], &s) == nil {
		tr.Content = s
	} else if json.Unmarshal(resp["error"], &s) == nil {
		tr.Content, tr.IsError = s, true
	}
	return tr
}

// valueFromSchema builds a JSON value that matches a JSON schema, or the
// OpenAPI subset Gemini uses ("type":"OBJECT"...): the first enum value,
// "simple" for strings, the minimum (or 1) for numbers, every property of
// an object. gemini-cli's router schema gives
// {"complexity_reasoning":"simple","complexity_score":1}.
func valueFromSchema(schema json.RawMessage) ([]byte, error) {
	var s any
	if err := json.Unmarshal(schema, &s); err != nil {
		return nil, err
	}
	return encodeJSON(schemaValue(s)), nil
}

func schemaValue(schema any) any {
	m, _ := schema.(map[string]any)
	if enum, ok := m["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	if c, ok := m["const"]; ok {
		return c
	}
	for _, key := range []string{"anyOf", "oneOf", "allOf"} {
		if alts, ok := m[key].([]any); ok && len(alts) > 0 {
			return schemaValue(alts[0])
		}
	}
	typ, _ := m["type"].(string)
	if types, ok := m["type"].([]any); ok && len(types) > 0 {
		typ, _ = types[0].(string)
	}
	switch strings.ToLower(typ) {
	case "string":
		return "simple"
	case "integer", "number":
		if lo, ok := m["minimum"].(float64); ok {
			return lo
		}
		return 1
	case "boolean":
		return false
	case "null":
		return nil
	case "array":
		if items, ok := m["items"]; ok {
			return []any{schemaValue(items)}
		}
		return []any{}
	}
	obj := map[string]any{}
	props, _ := m["properties"].(map[string]any)
	for name, sub := range props {
		obj[name] = schemaValue(sub)
	}
	return obj
}

func (*geminiDialect) toolID(int64) string { return "" } // Gemini's API sends no call ids

type geminiError struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
	} `json:"error"`
}

// newGeminiError builds a google.rpc.Status error; errType is its status,
// e.g. "RESOURCE_EXHAUSTED".
func newGeminiError(code int, errType, msg string) geminiError {
	if errType == "" {
		errType = geminiStatus(code)
	}
	var e geminiError
	e.Error.Code, e.Error.Message, e.Error.Status = code, errorMessage(code, msg), errType
	return e
}

func geminiStatus(code int) string {
	switch code {
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	if code >= 500 {
		return "INTERNAL"
	}
	return "INVALID_ARGUMENT"
}

func geminiFail(w http.ResponseWriter, status int, errType, msg string) {
	writeJSON(w, status, newGeminiError(status, errType, msg))
}

func (*geminiDialect) fail(w http.ResponseWriter, status int, errType, msg string) {
	geminiFail(w, status, errType, msg)
}

type geminiResponse struct {
	Candidates    []geminiCandidate `json:"candidates"`
	UsageMetadata *geminiUsage      `json:"usageMetadata,omitempty"`
	ModelVersion  string            `json:"modelVersion"`
	ResponseID    string            `json:"responseId"`
}

type geminiCandidate struct {
	Content      geminiContent `json:"content"`
	FinishReason string        `json:"finishReason,omitempty"`
	Index        int           `json:"index"`
}

type geminiUsage struct {
	PromptTokenCount        int `json:"promptTokenCount"`
	CandidatesTokenCount    int `json:"candidatesTokenCount"`
	TotalTokenCount         int `json:"totalTokenCount"`
	CachedContentTokenCount int `json:"cachedContentTokenCount,omitempty"`
}

// response wraps parts in a response; a final one carries the finish
// reason and usage.
func (d *geminiDialect) response(p *plan, parts []geminiPart, final bool) geminiResponse {
	c := geminiCandidate{Content: geminiContent{Role: "model", Parts: parts}}
	r := geminiResponse{ModelVersion: d.model, ResponseID: fmt.Sprintf("fake%06d", p.serial)}
	if final {
		c.FinishReason = p.stopReason(DialectGemini, "STOP", "STOP")
		prompt := p.usage.Input + p.usage.CacheRead
		r.UsageMetadata = &geminiUsage{
			PromptTokenCount:        prompt,
			CandidatesTokenCount:    p.usage.Output,
			TotalTokenCount:         prompt + p.usage.Output,
			CachedContentTokenCount: p.usage.CacheRead,
		}
	}
	r.Candidates = []geminiCandidate{c}
	return r
}

func geminiText(text string, thought bool) geminiPart {
	return geminiPart{Text: &text, Thought: thought}
}

func geminiCalls(p *plan) []geminiPart {
	var parts []geminiPart
	for _, t := range p.tools {
		parts = append(parts, geminiPart{FunctionCall: &geminiFunctionCall{ID: t.id, Name: t.name, Args: json.RawMessage(t.args)}})
	}
	return parts
}

func (d *geminiDialect) whole(w http.ResponseWriter, _ Request, p *plan) {
	var parts []geminiPart
	if p.Thinking != "" {
		parts = append(parts, geminiText(p.Thinking, true))
	}
	if p.Text != "" || (p.Thinking == "" && len(p.tools) == 0) {
		parts = append(parts, geminiText(p.Text, false))
	}
	parts = append(parts, geminiCalls(p)...)
	writeJSON(w, http.StatusOK, d.response(p, parts, true))
}

// geminiFrame frames an SSE event the way Google's servers do, with CRLFs.
func geminiFrame(v any) []byte {
	return append(append([]byte("data: "), encodeJSON(v)...), "\r\n\r\n"...)
}

// stream sends one part per event. The finish reason and usage ride on the
// last event, as gemini-cli expects, so a Hang reply never sends them.
func (d *geminiDialect) stream(st *stream, _ Request, p *plan) {
	if !st.open("text/event-stream") {
		return
	}
	var parts []geminiPart
	for _, c := range p.thinking {
		parts = append(parts, geminiText(c, true))
	}
	for _, c := range p.text {
		parts = append(parts, geminiText(c, false))
	}
	if p.MidStreamError != "" {
		for _, part := range parts {
			if !st.content(geminiFrame(d.response(p, []geminiPart{part}, false))) {
				return
			}
		}
		if st.hangPoint() {
			st.send(geminiFrame(newGeminiError(http.StatusInternalServerError, p.ErrorType, p.MidStreamError)))
		}
		return
	}
	parts = append(parts, geminiCalls(p)...)
	for i, part := range parts {
		final := i == len(parts)-1 && !p.Hang
		if !st.content(geminiFrame(d.response(p, []geminiPart{part}, final))) {
			return
		}
	}
	if len(parts) == 0 && st.hangPoint() {
		st.send(geminiFrame(d.response(p, []geminiPart{geminiText("", false)}, true)))
	}
}
