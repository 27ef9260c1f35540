package fakemodel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Config configures a Server. The zero value serves one model, "fake-model",
// and answers "ok" once the script is empty.
type Config struct {
	// MLX makes the OpenAI endpoint speak the mlx_lm.server dialect: role in
	// every delta, reasoning in delta.reasoning, whole tool calls, keep-alive
	// comments, string errors and a required Content-Length.
	MLX bool
	// Models are the served model names, listed by /api/tags and /v1/models.
	// Requests for other names are answered all the same. Default
	// ["fake-model"].
	Models []string
	// Default builds the reply to a model request that finds the script
	// empty. nil means Reply{Text: "ok"}. It may be called concurrently.
	Default func(Request) Reply
}

// Dialect names the wire format a model request arrived in.
type Dialect string

// The dialects a Server speaks. The mlx_lm.server variant of the OpenAI
// endpoint is DialectOpenAI too.
const (
	DialectAnthropic Dialect = "anthropic"
	DialectOpenAI    Dialect = "openai"
	DialectGemini    Dialect = "gemini"
	DialectOllama    Dialect = "ollama"
)

// Request is a model request as the Server received it.
type Request struct {
	Dialect  Dialect // DialectOpenAI for the mlx variant too
	Method   string
	Path     string // URL path, without the query
	RawQuery string // URL query, e.g. "beta=true" or "alt=sse"
	Header   http.Header
	Body     []byte // raw request body
	Model    string
	Stream   bool
	// UserText is the last text block of the last user message. Earlier
	// blocks of that message (Claude's <system-reminder>s) and messages of
	// other roles after it (Claude's mid-conversation system messages) do
	// not count. It is empty when that message holds only tool results.
	UserText string
	// ToolResults are the tool results the client sent back in this
	// request: those in the last user message (Anthropic, Gemini) or the
	// role "tool" messages after the last assistant message (OpenAI,
	// Ollama).
	ToolResults []ToolResult
	// Tools are the names of the tools the client offered, in order.
	Tools []string
}

// ToolResult is one tool result a client sent back to the model.
type ToolResult struct {
	ID      string // the tool call's id, if the dialect carries one
	Name    string // the tool's name, looked up from the call when the result lacks it
	Content string // the result's text parts, joined by newlines; a Gemini response other than {"output"} or {"error"} as JSON
	IsError bool
}

func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	r.Body = slices.Clone(r.Body)
	r.ToolResults = slices.Clone(r.ToolResults)
	r.Tools = slices.Clone(r.Tools)
	return r
}

// ErrClosed is wrapped by the error of WaitRequests when the Server closes
// before enough requests arrive.
var ErrClosed = errors.New("fakemodel: server closed")

// Server is a running fake model server. Create one with New or Start.
type Server struct {
	cfg       Config
	url       string
	srv       *http.Server
	serveDone chan struct{}
	closed    chan struct{} // closed by Close; unblocks delays and hangs
	closeOnce sync.Once
	ids       atomic.Int64 // source of message and tool call ids

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced whenever the fields below change
	script   []Reply
	requests []Request
	active   int // HTTP requests being handled
	isClosed bool
}

// New starts a Server listening on 127.0.0.1 at a port the system picks.
func New(cfg Config) (*Server, error) {
	if len(cfg.Models) == 0 {
		cfg.Models = []string{"fake-model"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakemodel: listening on loopback: %w", err)
	}
	s := &Server{
		cfg:       cfg,
		url:       "http://" + ln.Addr().String(),
		serveDone: make(chan struct{}),
		closed:    make(chan struct{}),
		changed:   make(chan struct{}),
	}
	s.srv = &http.Server{
		Handler:           s.track(s.routes()),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(s.serveDone)
		_ = s.srv.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return s, nil
}

// Start is New for tests: it fails tb if the Server cannot start and closes
// the Server when the test ends.
func Start(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// URL is the Server's base URL, "http://127.0.0.1:PORT", without a
// trailing slash. Clients append their own paths (/v1/messages, /v1, ...).
func (s *Server) URL() string { return s.url }

// Close stops the Server. Replies still streaming, hung or delayed are cut
// off: their connections close without a proper end of stream. Close waits
// for every handler to return and may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.isClosed = true
		s.broadcastLocked()
		s.mu.Unlock()
		// Close the connections first so that handlers woken below cannot
		// end their streams cleanly.
		_ = s.srv.Close()
		close(s.closed)
		<-s.serveDone
		s.waitFor(nil, func() bool { return s.active == 0 })
	})
}

// Script appends replies to the FIFO that all dialects share. Each model
// request takes the next one; auxiliary calls take none.
func (s *Server) Script(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, replies...)
	s.broadcastLocked()
}

// Pending reports how many scripted replies have not been taken yet.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.script)
}

// Requests returns every model request received so far, in arrival order.
// Auxiliary calls and malformed requests are not included.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requestsLocked()
}

func (s *Server) requestsLocked() []Request {
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		out[i] = r.clone()
	}
	return out
}

// WaitRequests waits until at least n model requests have arrived and
// returns them all. If ctx ends or the Server closes first, it returns the
// requests received so far with an error (wrapping ctx's error or
// ErrClosed).
func (s *Server) WaitRequests(ctx context.Context, n int) ([]Request, error) {
	ok := s.waitFor(ctx.Done(), func() bool { return len(s.requests) >= n || s.isClosed })
	s.mu.Lock()
	defer s.mu.Unlock()
	reqs := s.requestsLocked()
	switch {
	case len(reqs) >= n:
		return reqs, nil
	case !ok:
		return reqs, fmt.Errorf("fakemodel: waiting for %d requests, got %d: %w", n, len(reqs), ctx.Err())
	default:
		return reqs, fmt.Errorf("fakemodel: waiting for %d requests, got %d: %w", n, len(reqs), ErrClosed)
	}
}

// WaitIdle waits until no HTTP request is being handled, e.g. until a
// streaming reply has noticed that its client went away. It fails with
// ctx's error.
func (s *Server) WaitIdle(ctx context.Context) error {
	if !s.waitFor(ctx.Done(), func() bool { return s.active == 0 }) {
		return fmt.Errorf("fakemodel: waiting for idle: %w", ctx.Err())
	}
	return nil
}

// waitFor blocks until cond, evaluated under s.mu, holds (true) or done is
// closed (false). A nil done never fires.
func (s *Server) waitFor(done <-chan struct{}, cond func() bool) bool {
	for {
		s.mu.Lock()
		ok, changed := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-done:
			return false
		}
	}
}

func (s *Server) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// track counts the requests being handled so that Close and WaitIdle can
// wait for them.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.isClosed {
			s.mu.Unlock()
			http.Error(w, "fakemodel: server closed", http.StatusServiceUnavailable)
			return
		}
		s.active++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.active--
			s.broadcastLocked()
			s.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.handleAnthropic)
	mux.HandleFunc("POST /v1/chat/completions", s.handleOpenAI)
	mux.HandleFunc("POST /chat/completions", s.handleOpenAI)
	mux.HandleFunc("GET /v1/models", s.handleOpenAIModels)
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("POST /v1beta/models/{call}", s.handleGemini)
	mux.HandleFunc("POST /api/chat", s.handleOllama)
	mux.HandleFunc("GET /api/tags", s.handleOllamaTags)
	mux.HandleFunc("POST /api/show", s.handleOllamaShow)
	mux.HandleFunc("GET /api/version", s.handleOllamaVersion)
	// Everything else, including Claude Code's HEAD / preconnect.
	mux.HandleFunc("/", http.NotFound)
	return mux
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// maxBodyBytes bounds a request body; Claude Code's requests are ~100 KB.
const maxBodyBytes = 64 << 20

// dialect renders Replies in one wire format. Each implementation lives in
// the file named after it.
type dialect interface {
	// parse decodes a request body. A non-nil aux is the reply to an
	// auxiliary call, which is neither recorded nor scripted.
	parse(body []byte) (req Request, aux *Reply, err error)
	// toolID makes the id of the n-th generated tool call; "" sends none.
	toolID(n int64) string
	// fail answers with an error before any reply was sent. errType and
	// msg may be empty, meaning the dialect's usual ones for status.
	fail(w http.ResponseWriter, status int, errType, msg string)
	// whole answers a non-streaming request.
	whole(w http.ResponseWriter, req Request, p *plan)
	// stream answers a streaming request.
	stream(st *stream, req Request, p *plan)
}

// Every dialect implements the interface.
var _ = []dialect{anthropicDialect{}, &openaiDialect{}, &mlxDialect{}, &geminiDialect{}, &ollamaDialect{}}

// serveModel runs one model request through d: it reads and parses the
// body, records the request and takes its reply, then answers.
func (s *Server) serveModel(w http.ResponseWriter, r *http.Request, d dialect) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		d.fail(w, http.StatusBadRequest, "", "fakemodel: reading request body: "+err.Error())
		return
	}
	req, aux, err := d.parse(body)
	if err != nil {
		d.fail(w, http.StatusBadRequest, "", "fakemodel: malformed request: "+err.Error())
		return
	}
	req.Method, req.Path, req.RawQuery = r.Method, r.URL.Path, r.URL.RawQuery
	req.Header, req.Body = r.Header.Clone(), body

	var reply Reply
	if aux != nil {
		reply = *aux
	} else {
		reply = s.take(req)
	}
	if reply.Status != 0 {
		d.fail(w, reply.Status, reply.ErrorType, reply.ErrorMessage)
		return
	}
	p, err := newPlan(reply, func() string { return d.toolID(s.ids.Add(1)) }, s.ids.Add(1))
	if err != nil {
		d.fail(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	if !req.Stream {
		switch {
		case reply.Hang:
			s.hang(r.Context())
		case reply.MidStreamError != "":
			d.fail(w, http.StatusInternalServerError, reply.ErrorType, reply.MidStreamError)
		default:
			d.whole(w, req, p)
		}
		return
	}
	d.stream(s.newStream(w, r, reply), req, p)
}

// take records req and returns its reply: the next scripted one, or the
// default.
func (s *Server) take(req Request) Reply {
	s.mu.Lock()
	s.requests = append(s.requests, req)
	var (
		reply    Reply
		scripted = len(s.script) > 0
	)
	if scripted {
		reply = s.script[0]
		s.script = s.script[1:]
	}
	s.broadcastLocked()
	s.mu.Unlock()
	switch {
	case scripted:
		return reply
	case s.cfg.Default != nil:
		return s.cfg.Default(req.clone())
	default:
		return Reply{Text: "ok"}
	}
}

// hang blocks until the client goes away or the Server closes.
func (s *Server) hang(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.closed:
	}
}
