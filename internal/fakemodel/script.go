package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Reply is what the fake model answers to one model request. Content is
// sent in a fixed order: Thinking, then Text, then ToolCalls.
type Reply struct {
	Thinking  string
	Text      string
	ToolCalls []ToolCall
	// StopReason overrides the reason the reply ends. Any dialect's word
	// may be used: the well-known ones (end_turn/stop/STOP,
	// max_tokens/length/MAX_TOKENS, tool_use/tool_calls, stop_sequence)
	// are translated into the serving dialect's; others are sent as given.
	// Default: tool_use (or the dialect's equivalent) if there are
	// ToolCalls, else end_turn (or the dialect's equivalent).
	StopReason string
	// Usage is reported with the reply. A zero Input means 10 and a zero
	// Output means about one token per word of the content.
	Usage Usage

	// Status, if non-zero, fails the request with this HTTP status before
	// anything is streamed, with the dialect's error body. ErrorType and
	// ErrorMessage fill it; empty means the dialect's usual ones for the
	// status (Anthropic "overloaded_error" for 529, Gemini
	// "RESOURCE_EXHAUSTED" for 429, ...).
	Status       int
	ErrorType    string
	ErrorMessage string
	// MidStreamError, if set, makes a stream fail after its thinking and
	// text, before any tool call and before it ends, in the dialect's
	// mid-stream way (an Anthropic error event, an OpenAI error chunk, an
	// Ollama error line...). ErrorType applies to it too. A non-streaming
	// request fails with status 500 instead.
	MidStreamError string

	// ChunkSize is the number of runes per text or thinking delta and per
	// tool argument fragment. Default 8.
	ChunkSize int
	// Delay is the pause between two frames of a stream.
	Delay time.Duration
	// Hang stops a stream after its first content frame (or, with no
	// content, after its opening frames): nothing more is sent until the
	// client disconnects or the Server closes. A non-streaming request gets
	// no answer at all.
	Hang bool
}

// ToolCall is a tool call the fake model makes.
type ToolCall struct {
	// ID is the call's id. Empty means one made in the dialect's style
	// (toolu_…, call_…, a UUID for mlx); Gemini sends none, as its API does,
	// and gemini-cli makes its own.
	ID   string
	Name string
	// Input is the call's arguments, a JSON object; empty means {}.
	Input json.RawMessage
}

// Usage is the token usage reported with a reply, counted the way
// Anthropic counts it: Input excludes the cached tokens. Dialects whose
// prompt count includes the cache (OpenAI, mlx, Gemini) report
// Input+CacheRead as the prompt with CacheRead as its cached part; Ollama
// reports Input. CacheCreation is reported by Anthropic only.
type Usage struct {
	Input, Output, CacheRead, CacheCreation int
}

// defaultChunkSize is the runes per delta when Reply.ChunkSize is zero.
const defaultChunkSize = 8

// plan is a Reply prepared for rendering: content cut into deltas, tool
// call ids and arguments settled and usage defaulted.
type plan struct {
	Reply
	serial   int64 // unique in the Server; used for message ids
	thinking []string
	text     []string
	tools    []plannedTool
	usage    Usage
}

type plannedTool struct {
	id, name string
	args     string   // compact JSON object
	argParts []string // args cut into fragments
}

// newPlan prepares r. newID makes the id of a tool call that has none.
func newPlan(r Reply, newID func() string, serial int64) (*plan, error) {
	size := r.ChunkSize
	if size <= 0 {
		size = defaultChunkSize
	}
	p := &plan{
		Reply:    r,
		serial:   serial,
		thinking: chunk(r.Thinking, size),
		text:     chunk(r.Text, size),
		usage:    r.Usage,
	}
	words := len(strings.Fields(r.Thinking)) + len(strings.Fields(r.Text))
	for _, tc := range r.ToolCalls {
		args, err := compactObject(tc.Input)
		if err != nil {
			return nil, fmt.Errorf("fakemodel: scripted tool call %q: %w", tc.Name, err)
		}
		id := tc.ID
		if id == "" {
			id = newID()
		}
		p.tools = append(p.tools, plannedTool{id: id, name: tc.Name, args: args, argParts: chunk(args, size)})
		words += 1 + len(strings.FieldsFunc(args, func(c rune) bool {
			return !unicode.IsLetter(c) && !unicode.IsDigit(c)
		}))
	}
	if p.usage.Input == 0 {
		p.usage.Input = 10
	}
	if p.usage.Output == 0 {
		p.usage.Output = max(words, 1)
	}
	return p, nil
}

// compactObject checks that raw is a JSON object and compacts it.
func compactObject(raw json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "{}", nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return "", fmt.Errorf("invalid input JSON: %w", err)
	}
	if buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return "", fmt.Errorf("input is not a JSON object: %s", buf.Bytes())
	}
	return buf.String(), nil
}

// chunk cuts s into pieces of n runes; "" gives none.
func chunk(s string, n int) []string {
	var out []string
	for s != "" {
		i, runes := 0, 0
		for i < len(s) && runes < n {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			runes++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// stopReasons translates the well-known stop reasons of every dialect into
// each dialect's own.
var stopReasons = map[Dialect]map[string]string{
	DialectAnthropic: {
		"stop": "end_turn", "STOP": "end_turn", "length": "max_tokens",
		"MAX_TOKENS": "max_tokens", "tool_calls": "tool_use",
	},
	DialectOpenAI: {
		"end_turn": "stop", "stop_sequence": "stop", "STOP": "stop",
		"max_tokens": "length", "MAX_TOKENS": "length", "tool_use": "tool_calls",
	},
	DialectGemini: {
		"end_turn": "STOP", "stop": "STOP", "stop_sequence": "STOP",
		"tool_use": "STOP", "tool_calls": "STOP",
		"max_tokens": "MAX_TOKENS", "length": "MAX_TOKENS",
	},
	DialectOllama: {
		"end_turn": "stop", "stop_sequence": "stop", "STOP": "stop",
		"tool_use": "stop", "tool_calls": "stop",
		"max_tokens": "length", "MAX_TOKENS": "length",
	},
}

// stopReason is p's stop reason in dialect d, where toolStop and endStop
// are d's defaults with and without tool calls.
func (p *plan) stopReason(d Dialect, toolStop, endStop string) string {
	switch {
	case p.StopReason != "":
		if s, ok := stopReasons[d][p.StopReason]; ok {
			return s
		}
		return p.StopReason
	case len(p.tools) > 0:
		return toolStop
	default:
		return endStop
	}
}

// errorMessage is msg, or a message for status when msg is empty.
func errorMessage(status int, msg string) string {
	switch {
	case msg != "":
		return msg
	case status == 529:
		return "Overloaded"
	case http.StatusText(status) != "":
		return http.StatusText(status)
	default:
		return fmt.Sprintf("HTTP %d", status)
	}
}

// titlePrefix starts the user message of opencode's title-generation call.
const titlePrefix = "Generate a title for this conversation"

// titleText is the title given to title-generation calls.
const titleText = "Fake conversation"

// auxTitle returns the reply to a title-generation call if one of the
// user texts asks for a title, else nil.
func auxTitle(userTexts []string) *Reply {
	for _, t := range userTexts {
		if strings.HasPrefix(strings.TrimSpace(t), titlePrefix) {
			return &Reply{Text: titleText}
		}
	}
	return nil
}
