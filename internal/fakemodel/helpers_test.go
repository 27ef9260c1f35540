package fakemodel_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// testTimeout bounds every wait in these tests; it is a guard against
// hangs, never an assertion about speed.
const testTimeout = 10 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// post sends body (a string, []byte or a value to marshal) to url.
func post(t *testing.T, ctx context.Context, url string, body any, header ...string) *http.Response {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func get(t *testing.T, ctx context.Context, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// decodeJSON reads resp's body into v after checking its status.
func decodeJSON(t *testing.T, resp *http.Response, status int, v any) {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
}

// sseEvent is one server-sent event; a comment line is an event named ":"
// whose data is the comment.
type sseEvent struct {
	Event, Data string
}

// readSSE parses a whole SSE stream, accepting LF or CRLF line ends.
func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var (
		events []sseEvent
		cur    sseEvent
		data   []string
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		switch {
		case line == "":
			if data != nil || cur.Event != "" {
				cur.Data = strings.Join(data, "\n")
				events = append(events, cur)
			}
			cur, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
			events = append(events, sseEvent{Event: ":", Data: strings.TrimSpace(line[1:])})
		case strings.HasPrefix(line, "event:"):
			cur.Event = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(line[len("data:"):], " "))
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading SSE: %v", err)
	}
	if data != nil {
		t.Fatalf("SSE stream ends inside an event: %q", data)
	}
	return events
}

// call is a decoded tool call.
type call struct {
	ID, Name, Args string
}

// decoded is what a client made of a reply, in any dialect.
type decoded struct {
	Thinking, Text string
	Calls          []call
	Stop           string
	Error          string
	Done           bool // the stream ended properly
	Input, Output  int
}

// compact re-encodes JSON compactly, for comparing arguments.
func compact(t *testing.T, s string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		t.Fatalf("compacting %q: %v", s, err)
	}
	return buf.String()
}

// dialectCase drives one dialect in tests that run against all of them.
type dialectCase struct {
	name string
	cfg  fakemodel.Config
	// send posts a streaming (or not) request whose user text is text.
	send func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response
	// decode reads a whole streaming reply.
	decode func(t *testing.T, body io.Reader) decoded
	// endMarker is in the last frame of a complete stream only.
	endMarker string
}

var dialectCases = []dialectCase{
	{
		name: "anthropic",
		send: func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response {
			return post(t, ctx, s.URL()+"/v1/messages?beta=true", anthropicBody(text, stream))
		},
		decode:    decodeAnthropic,
		endMarker: "message_stop",
	},
	{
		name: "openai",
		send: func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response {
			return post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody(text, stream))
		},
		decode:    decodeOpenAI,
		endMarker: "[DONE]",
	},
	{
		name: "mlx",
		cfg:  fakemodel.Config{MLX: true},
		send: func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response {
			return post(t, ctx, s.URL()+"/v1/chat/completions", openaiBody(text, stream))
		},
		decode:    decodeOpenAI,
		endMarker: "[DONE]",
	},
	{
		name: "gemini",
		send: func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response {
			return post(t, ctx, geminiURL(s, "gemini-test", stream), geminiBody(text))
		},
		decode:    decodeGemini,
		endMarker: "finishReason",
	},
	{
		name: "ollama",
		send: func(t *testing.T, ctx context.Context, s *fakemodel.Server, text string, stream bool) *http.Response {
			return post(t, ctx, s.URL()+"/api/chat", ollamaBody(text, stream))
		},
		decode:    decodeOllama,
		endMarker: `"done":true`,
	},
}

// readUntil reads r line by line until a line contains marker and returns
// what it read.
func readUntil(t *testing.T, r *bufio.Reader, marker string) string {
	t.Helper()
	var read strings.Builder
	for {
		line, err := r.ReadString('\n')
		read.WriteString(line)
		if strings.Contains(line, marker) {
			return read.String()
		}
		if err != nil {
			t.Fatalf("stream ended (%v) before %q; read %q", err, marker, read.String())
		}
	}
}

// captured is one request from the reference transcripts.
type captured struct {
	N       int               `json:"n"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Query   string            `json:"query"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

func loadCaptured(t *testing.T, name string) []captured {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var out []captured
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var c captured
		if err := dec.Decode(&c); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, c)
	}
}

// replay sends a captured request to s as the CLI sent it.
func replay(t *testing.T, ctx context.Context, s *fakemodel.Server, c captured) *http.Response {
	t.Helper()
	url := s.URL() + c.Path
	if c.Query != "" {
		url += "?" + c.Query
	}
	var header []string
	for k, v := range c.Headers {
		header = append(header, k, v)
	}
	return post(t, ctx, url, []byte(c.Body), header...)
}
