package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// ollamaDialect talks to Ollama's own API: POST /api/chat, answered as
// NDJSON, one chunk a line, thinking and text in pieces, each tool call
// whole with its arguments as an object, and a last chunk with done:true
// and the token counts.
type ollamaDialect struct {
	host   string // base URL, e.g. http://127.0.0.1:11434
	client *http.Client
}

// newOllama makes the dialect for the Ollama server at host, a base URL
// such as http://127.0.0.1:11434.
func newOllama(host string) *ollamaDialect {
	return &ollamaDialect{host: strings.TrimRight(host, "/"), client: newModelClient()}
}

var _ dialect = (*ollamaDialect)(nil)

// Ollama's options for every round: a context large enough for tool
// results, and answers that do not wander.
const (
	ollamaNumCtx      = 16384
	ollamaTemperature = 0.0
)

type ollamaRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages"`
	Stream   bool            `json:"stream"`
	Tools    []functionTool  `json:"tools,omitempty"`
	Options  struct {
		NumCtx      int     `json:"num_ctx"`
		Temperature float64 `json:"temperature"`
	} `json:"options"`
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type ollamaToolCall struct {
	ID       string `json:"id,omitempty"` // sent by the server, not back to it
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"` // an object, not a string
	} `json:"function"`
}

// ollamaChunk is one line of a streamed answer.
type ollamaChunk struct {
	Message struct {
		Content   string           `json:"content"`
		Thinking  string           `json:"thinking"`
		ToolCalls []ollamaToolCall `json:"tool_calls"`
	} `json:"message"`
	Done            bool            `json:"done"`
	DoneReason      string          `json:"done_reason"`
	PromptEvalCount int64           `json:"prompt_eval_count"`
	EvalCount       int64           `json:"eval_count"`
	Error           json.RawMessage `json:"error"`
}

func (d *ollamaDialect) chat(ctx context.Context, req chatRequest, each func(delta) error) error {
	body, err := json.Marshal(ollamaBody(req))
	if err != nil {
		return fmt.Errorf("ollama: encoding the request: %w", err)
	}
	build := func(ctx context.Context) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, d.host+"/api/chat", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r.Header.Set("Content-Type", "application/json")
		r.Close = true // sends Connection: close
		return r, nil
	}
	return postChat(ctx, d.client, "ollama", build, readOllama, each)
}

// ollamaBody renders req in Ollama's shape.
func ollamaBody(req chatRequest) ollamaRequest {
	out := ollamaRequest{
		Model:    req.Model,
		Messages: make([]ollamaMessage, 0, len(req.Messages)),
		Stream:   true,
		Tools:    functionTools(req.Tools),
	}
	out.Options.NumCtx, out.Options.Temperature = ollamaNumCtx, ollamaTemperature
	for _, m := range req.Messages {
		om := ollamaMessage{Role: m.Role, Content: m.Content}
		switch m.Role {
		case "assistant":
			om.Thinking = m.Thinking
			for _, tc := range m.ToolCalls {
				var call ollamaToolCall
				call.Function.Name, call.Function.Arguments = tc.Name, objectOrEmpty(tc.Arguments)
				om.ToolCalls = append(om.ToolCalls, call)
			}
		case "tool":
			om.ToolName = m.ToolName
		}
		out.Messages = append(out.Messages, om)
	}
	return out
}

// readOllama reads an NDJSON answer until its done line.
func readOllama(body io.Reader, emit func(delta) error) error {
	sc := newLineScanner(body)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var c ollamaChunk
		if err := json.Unmarshal(line, &c); err != nil {
			return fmt.Errorf("ollama: unreadable line %q: %w", clipForError(line), err)
		}
		if jsonPresent(c.Error) {
			return fmt.Errorf("ollama: %s", serverErrorText(c.Error))
		}
		if c.Message.Thinking != "" {
			if err := emit(delta{Thinking: c.Message.Thinking}); err != nil {
				return err
			}
		}
		if c.Message.Content != "" {
			if err := emit(delta{Text: c.Message.Content}); err != nil {
				return err
			}
		}
		if len(c.Message.ToolCalls) > 0 {
			calls := make([]toolCall, 0, len(c.Message.ToolCalls))
			for _, tc := range c.Message.ToolCalls {
				calls = append(calls, toolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: rawArgs(tc.Function.Arguments)})
			}
			if err := emit(delta{ToolCalls: calls}); err != nil {
				return err
			}
		}
		if c.Done {
			return emit(delta{Done: true, Stop: c.DoneReason, Usage: &schemas.Usage{
				InputTokens:  c.PromptEvalCount,
				OutputTokens: c.EvalCount,
				CostUSD:      schemas.Cost(0),
			}})
		}
	}
	return streamEnd("ollama", sc.Err())
}

// What follows is shared with openai.go.

// newModelClient makes a dialect's HTTP client. It has no overall timeout,
// since an answer streams for as long as the model writes (ctx bounds it),
// and keeps no connection alive, so that every request, a retry included,
// goes out on a fresh one.
func newModelClient() *http.Client {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true}}
	}
	t = t.Clone()
	t.DisableKeepAlives = true
	return &http.Client{Transport: t}
}

// brokenAnswer is a failure of the connection, not an answer from the
// server: the request could not be sent, or the answer broke off. It is
// worth one retry when nothing of the answer was delivered.
type brokenAnswer struct{ err error }

func (b *brokenAnswer) Error() string { return b.err.Error() }
func (b *brokenAnswer) Unwrap() error { return b.err }

// postChat sends one round with a request made by build and reads the
// answer with read, which calls emit with every delta. It retries once,
// on a fresh connection, when the request failed or the answer broke off
// before any delta was delivered. What the server answered (an HTTP error
// status, an error in the stream) is final, and so is an error from each,
// which is returned as it is.
func postChat(ctx context.Context, client *http.Client, label string,
	build func(context.Context) (*http.Request, error),
	read func(io.Reader, func(delta) error) error,
	each func(delta) error,
) error {
	var err error
	for range 2 {
		var (
			delivered bool
			eachErr   error
		)
		emit := func(d delta) error {
			delivered = true
			eachErr = each(d)
			return eachErr
		}
		err = sendChat(ctx, client, label, build, read, emit)
		var broken *brokenAnswer
		switch {
		case err == nil:
			return nil
		case eachErr != nil:
			return eachErr
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", label, ctx.Err())
		case delivered || !errors.As(err, &broken):
			return err
		}
	}
	return err
}

// sendChat is one attempt of postChat.
func sendChat(ctx context.Context, client *http.Client, label string,
	build func(context.Context) (*http.Request, error),
	read func(io.Reader, func(delta) error) error,
	emit func(delta) error,
) error {
	req, err := build(ctx)
	if err != nil {
		return fmt.Errorf("%s: making the request: %w", label, err)
	}
	res, err := client.Do(req)
	if err != nil {
		return &brokenAnswer{fmt.Errorf("%s: sending the request: %w", label, err)}
	}
	defer res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return statusError(label, res)
	}
	return read(res.Body, emit)
}

// statusError describes an HTTP error answer by its message and status.
func statusError(label string, res *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil && jsonPresent(e.Error) {
		msg = serverErrorText(e.Error)
	}
	if msg == "" {
		msg = clipForError(bytes.TrimSpace(body))
	}
	if msg == "" {
		msg = http.StatusText(res.StatusCode)
	}
	return fmt.Errorf("%s: %s (%d)", label, msg, res.StatusCode)
}

// serverErrorText reads an error value: a string (Ollama, mlx) or an object
// with a message (OpenAI); anything else as its JSON.
func serverErrorText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Message != "" {
		return obj.Message
	}
	return clipForError(raw)
}

// jsonPresent reports whether a JSON field was present and not null.
func jsonPresent(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// streamEnd is the error of an answer that ended, with err from its
// reader, before its last line.
func streamEnd(label string, err error) error {
	switch {
	case errors.Is(err, bufio.ErrTooLong):
		return fmt.Errorf("%s: a line of the answer is longer than %d bytes", label, maxAnswerLine)
	case err != nil:
		return &brokenAnswer{fmt.Errorf("%s: reading the answer: %w", label, err)}
	default:
		return &brokenAnswer{fmt.Errorf("%s: the stream ended before the answer was complete", label)}
	}
}

// maxAnswerLine bounds one line of an answer; a tool call carrying a whole file
// fits.
const maxAnswerLine = 32 << 20

func newLineScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxAnswerLine)
	return sc
}

// clipForError is b for an error message, cut to a readable length.
func clipForError(b []byte) string {
	const limit = 300
	if len(b) <= limit {
		return string(b)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "…"
}

// functionTool is a tool offered to the model, in the shape Ollama and
// OpenAI share.
type functionTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// emptyParameters is the parameters of a tool that declares none.
const emptyParameters = `{"type":"object","properties":{}}`

func functionTools(specs []toolSpec) []functionTool {
	var out []functionTool
	for _, s := range specs {
		t := functionTool{Type: "function"}
		t.Function.Name, t.Function.Description = s.Name, s.Description
		t.Function.Parameters = s.Parameters
		if !jsonPresent(bytes.TrimSpace(s.Parameters)) {
			t.Function.Parameters = json.RawMessage(emptyParameters)
		}
		out = append(out, t)
	}
	return out
}

// objectOrEmpty is a call's arguments for sending back: {} when it has
// none.
func objectOrEmpty(args json.RawMessage) json.RawMessage {
	if !jsonPresent(bytes.TrimSpace(args)) {
		return json.RawMessage(`{}`)
	}
	return args
}

// rawArgs makes the arguments of a call as a server sent them, a JSON
// value, into a JSON object: an object stays, a string is read as the
// text of one (argsObject), absence is {}.
func rawArgs(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return argsObject(s)
	}
	return argsObject(string(raw))
}

// argsObject makes the text of a call's arguments into a JSON object:
// text that is one is compacted, blank text is {}, and anything else is
// kept as {"_raw": text}, so that the arguments are always an object.
func argsObject(text string) json.RawMessage {
	trimmed := strings.TrimSpace(text)
	if trimmed == "" || trimmed == "null" {
		return json.RawMessage(`{}`)
	}
	var buf bytes.Buffer
	if trimmed[0] == '{' && json.Compact(&buf, []byte(trimmed)) == nil {
		return buf.Bytes()
	}
	wrapped, _ := json.Marshal(map[string]string{"_raw": text}) // a map of strings always encodes
	return wrapped
}
