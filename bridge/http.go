package bridge

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
)

// idleTimeout is how long the endpoint keeps a connection that waits
// for its next request: without one, any caller (a refused one too)
// could keep connections open for ever, each a file descriptor of the
// coordinator's.
var idleTimeout = time.Minute

// bodyTimeout is how long a request's body may take to arrive, from its
// headers on: without it a caller (one without a token too, whose body
// the server reads before it answers the refusal) could declare a body
// and never send it, and hold its connection for good.
var bodyTimeout = time.Minute

// maxConns bounds the connections the endpoint (and the dashboard
// beside it) holds at once, each a file descriptor of the process that
// also keeps the store's files open: a quarter of the process's open
// files, 4,096 where that is unknown. Past it a new connection
// waits to be accepted until one closes.
var maxConns = httpConns(openFileLimit())

func httpConns(limit uint64) int {
	if limit == 0 {
		return 4096
	}
	return int(max(min(limit/4, 1<<20), 64))
}

// MCPPath is where the MCP endpoint is served.
const MCPPath = "/mcp"

// HTTPConfig secures the MCP endpoint.
type HTTPConfig struct {
	// Token, when set, must come as "Authorization: Bearer <token>". A
	// listener off loopback refuses to start without a token.
	Token string
	// ObserverToken is a second bearer token that may only observe: the
	// tools that read (schemas.ReadOnlyTools) and no other.
	ObserverToken string
	// AllowedOrigins are browser origins allowed besides loopback ones
	// (e.g. "https://app.example.com").
	AllowedOrigins []string
	// Web, when set, is served at / beside the MCP endpoint (the web
	// dashboard, which checks the same tokens itself).
	Web http.Handler
}

// HTTPHandler serves MCP over Streamable HTTP until ctx ends. It checks
// the bearer token and the Origin header, tells the door which agent is
// calling from the X-Shoal-Agent-Id header its node's MCP config
// carries, bounds each request's body, the bodies each caller has in
// flight (bodies.go) and each caller's sessions (sessions.go), and ends
// sessions left idle.
func (m *MCP) HTTPHandler(ctx context.Context, cfg HTTPConfig) http.Handler {
	live, held := newSessions(), newBodies()
	mcpHTTP := server.NewStreamableHTTPServer(m.srv,
		server.WithEndpointPath(MCPPath),
		server.WithSessionIdManagerResolver(live),
		server.WithSessionIdleTTL(sessionIdle),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if id := r.Header.Get(schemas.AgentIDHeader); id != "" {
				return WithCallingAgent(ctx, id) // admitted with its own token (below)
			}
			if cfg.ObserverToken != "" && matches(bearer(r), cfg.ObserverToken) && !matches(bearer(r), cfg.Token) {
				ctx = withObserver(ctx)
			}
			return ctx
		}),
	)
	// Its sweep of idle sessions ends with ctx.
	context.AfterFunc(ctx, func() { mcpHTTP.Shutdown(context.WithoutCancel(ctx)) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && !originAllowed(o, cfg.AllowedOrigins) {
			http.Error(w, "origin not allowed: "+o, http.StatusForbidden)
			return
		}
		id := r.Header.Get(schemas.AgentIDHeader)
		if id != "" && schemas.ValidID(id) != nil {
			http.Error(w, "malformed "+schemas.AgentIDHeader+" header", http.StatusBadRequest)
			return
		}
		if cfg.Token != "" || cfg.ObserverToken != "" {
			got := bearer(r)
			switch {
			case id != "" && !matches(got, cfg.Token) && !m.agentToken(r.Context(), cfg.Token, id, got):
				// An agent's id comes with that agent's own token (or the
				// full token, which the id only narrows); the observer's
				// token names no agent, and acting as one would widen it.
				w.Header().Set("WWW-Authenticate", `Bearer realm="shoal"`)
				http.Error(w, "an agent's calls carry that agent's own token, and this one is not: an agent opened before the coordinator restarted with another --mcp-token holds one made from the old; close the agent and open it again (the same id goes on) for its node to give it one made from the current", http.StatusUnauthorized)
				return
			case id == "" && !matches(got, cfg.Token) && !matches(got, cfg.ObserverToken):
				w.Header().Set("WWW-Authenticate", `Bearer realm="shoal"`)
				msg := "a bearer token is required"
				if got != "" {
					msg = "the bearer token is not one this endpoint accepts (its full or observer token)"
				}
				http.Error(w, msg, http.StatusUnauthorized)
				return
			}
		}
		// Where no token is set an agent's id is no credential, but it
		// still narrows: an agent's sessions and calls count as its own
		// (a sandboxed agent's proxy sets the header, whatever the agent
		// sent), and one agent cannot use up everyone's.
		who := "everyone"
		switch got := bearer(r); {
		case id != "":
			who = "agent:" + id
		case matches(got, cfg.Token):
			who = "full"
		case matches(got, cfg.ObserverToken):
			who = "observer"
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxMCPBody)
		// What begins a session (an initialize, whatever session header
		// it carries) is held to the caller's bound; a stream is opened
		// on one of the caller's own sessions (mcp-go would make one of
		// any id it is given, and one of none that nothing ends: a page
		// of any site may send a GET to a loopback endpoint).
		begins := false
		switch sid := r.Header.Get(server.HeaderKeySessionID); r.Method {
		case http.MethodPost:
			// Held to the caller's bound until it is answered: what it
			// says it sends, or the most a body may be.
			size := int64(maxMCPBody)
			if r.ContentLength >= 0 && r.ContentLength < size {
				size = r.ContentLength
			}
			if err := held.take(who, size); err != nil {
				w.Header().Set("Retry-After", "1")
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			// Given back when the call's arguments are decoded and
			// checked (a turn's agent_run holds its body no longer than
			// that), or when it is answered, whichever is first.
			done := sync.OnceFunc(func() { held.give(who, size) })
			defer done()
			r = r.WithContext(context.WithValue(r.Context(), bodyReadKey{}, done))
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, fmt.Sprintf("the request's body: %v (at most %d bytes)", err, maxMCPBody), http.StatusRequestEntityTooLarge)
				return
			}
			if n := int64(len(body)); n < size {
				held.give(who, size-n) // a body without its length, shorter than the most
				size = n
			}
			// The MCP library decodes the whole request before any tool
			// sees it.
			if err := validate.CheckValues(body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
			}
			// (A client of the 2026-07-28 protocol has no session.)
			begins = json.Unmarshal(body, &msg) == nil && msg.Method == string(mcp.MethodInitialize) &&
				!mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion))
		case http.MethodGet:
			if sid == "" {
				http.Error(w, "a stream is opened on a session: initialize first, then send its "+server.HeaderKeySessionID+" header", http.StatusBadRequest)
				return
			}
			done, ok := live.use(who, sid)
			if !ok {
				http.Error(w, "no such session under these credentials: "+sid, http.StatusNotFound)
				return
			}
			defer done() // a stream is a use under way while it is open
		}
		if begins {
			ended, err := live.room(who)
			for _, id := range ended {
				forget(mcpHTTP, r, id)
			}
			if err != nil {
				w.Header().Set("Retry-After", "60")
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		} else if sid := r.Header.Get(server.HeaderKeySessionID); sid != "" && r.Method != http.MethodGet {
			done, _ := live.use(who, sid) // another's, or none: mcp-go says so
			defer done()
		}
		sw := &progressWriter{ResponseWriter: w, wrote: make(chan struct{}, 1)}
		r = r.WithContext(context.WithValue(r.Context(), progressWriterKey{}, sw))
		mcpHTTP.ServeHTTP(sw, withPrincipal(r, who))
	})
}

// forget has the MCP library forget session id, which the endpoint has
// ended (sessions.room): the DELETE a client would have sent, made of
// r (the request beginning a session in its place, whose host and
// connection pass the library's checks), answered to nobody.
func forget(mcpHTTP http.Handler, r *http.Request, id string) {
	d := r.Clone(context.WithoutCancel(r.Context()))
	d.Method = http.MethodDelete
	d.Header = http.Header{server.HeaderKeySessionID: {id}}
	d.Body, d.ContentLength = http.NoBody, 0
	mcpHTTP.ServeHTTP(discard{}, d)
}

// discard is a response nobody reads.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// A progressWriter counts the progress notifications written to a call's
// response. mcp-go (v1.2.1) drops a notification its forwarder has taken
// but not yet written when the call's reply is written, so a call that
// reported progress waits for its last reports to be written first.
type progressWriter struct {
	http.ResponseWriter
	written atomic.Int64
	wrote   chan struct{} // a progress notification was written
}

type progressWriterKey struct{}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.ResponseWriter.Write(b)
	if bytes.Contains(b, []byte(`"notifications/progress"`)) {
		p.written.Add(1)
		select {
		case p.wrote <- struct{}{}:
		default:
		}
	}
	return n, err
}

// Flush is the response's: mcp-go streams only to a Flusher.
func (p *progressWriter) Flush() {
	if f, ok := p.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// awaitProgress waits, up to d, until n progress notifications of the
// call whose ctx this is are written.
func awaitProgress(ctx context.Context, n int64, d time.Duration) {
	p, ok := ctx.Value(progressWriterKey{}).(*progressWriter)
	if !ok {
		return
	}
	timeout := time.After(d)
	for p.written.Load() < n {
		select {
		case <-p.wrote:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// agentToken reports whether got is the token of the live agent id: the
// one the node its record names derived for this life of it, from that
// node's key (schemas.EndpointAgentToken). A node's key makes tokens for
// its own agents only, and an agent id header alone is no credential.
func (m *MCP) agentToken(ctx context.Context, endpointToken, id, got string) bool {
	if endpointToken == "" || id == "" || got == "" {
		return false
	}
	rec, err := m.f.Record(ctx, id)
	if err != nil || rec.Status == schemas.StatusDead || rec.Node == "" {
		return false
	}
	return matches(got, schemas.EndpointAgentToken(endpointToken, rec.Node, id, rec.RequestID))
}

// bearer is the request's bearer token, or "".
func bearer(r *http.Request) string {
	got, _ := schemas.BearerToken(r.Header.Get("Authorization"))
	return got
}

// matches compares a presented token with a configured one in constant
// time; an unset token matches nothing.
func matches(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// originAllowed accepts loopback origins and the configured ones.
func originAllowed(origin string, allowed []string) bool {
	if slices.Contains(allowed, origin) {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return isLoopbackHost(u.Hostname())
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// CheckListen refuses what ListenHTTP would: an address it cannot read,
// or one off loopback without a token. A caller may ask before it starts
// anything else.
func CheckListen(addr string, cfg HTTPConfig) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("MCP listen address %q: %w", addr, err)
	}
	if !isLoopbackHost(host) && cfg.Token == "" && cfg.ObserverToken == "" {
		return fmt.Errorf("refusing to serve MCP on %s without a bearer token: set one (shoal up --mcp-token), or listen on 127.0.0.1", addr)
	}
	return nil
}

// ListenHTTP serves the MCP endpoint on addr until ctx ends. It refuses a
// listener off loopback without a token. ready, when given, receives the
// endpoint's URL once it accepts connections.
func (m *MCP) ListenHTTP(ctx context.Context, addr string, cfg HTTPConfig, ready func(url string)) error {
	if err := CheckListen(addr, cfg); err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("MCP endpoint: %w", err)
	}
	l = limitConns(l, maxConns)
	mux := http.NewServeMux()
	mux.Handle(MCPPath, m.HTTPHandler(ctx, cfg))
	if cfg.Web != nil {
		mux.Handle("/", cfg.Web)
	}
	// Requests live within ctx, so a stream a browser holds open ends
	// with the listener rather than holding up its shutdown.
	srv := &http.Server{Handler: boundBodyTime(mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, BaseContext: func(net.Listener) context.Context { return ctx }}
	shut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(shut)
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	})
	// Returns once the shutdown has (what is still being sent or read
	// waits for it, up to its 5 s).
	defer func() {
		if !stop() {
			<-shut
		}
	}()
	if ready != nil {
		ready("http://" + l.Addr().String() + MCPPath)
	}
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// boundBodyTime holds a request's body to bodyTimeout: its reads fail
// past it, and so does the server's own read of what a handler left
// unread. Once the body is read whole the connection has no deadline
// again (a call's answer may stream for as long as it runs).
//
// A refusal of who is calling (401, 403) closes the connection, and so
// does any refusal written before a small body is read: a caller without
// a token would otherwise keep its connection, one of maxConns, for as
// long as it sent a refused request a minute, and the server would read
// what is left of an unread body (for the connection's next request)
// for as long as the caller took to send it. A large body's refusal
// closes its connection already (the server reads none of it).
func boundBodyTime(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b *timedBody
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(bodyTimeout)) == nil {
				b = &timedBody{ReadCloser: r.Body, read: func() { rc.SetReadDeadline(time.Time{}) }}
				r.Body = b
			}
		}
		if r.ContentLength >= 0 && r.ContentLength < 256<<10 {
			w = &refusalCloses{ResponseWriter: w, body: b}
		}
		h.ServeHTTP(w, r)
	})
}

// refusalCloses is a response whose refusal of the caller, or whose
// refusal written while its request's body is unread, closes the
// connection; the body's rest is not read.
type refusalCloses struct {
	http.ResponseWriter
	body *timedBody // nil without a body
}

func (w *refusalCloses) WriteHeader(code int) {
	unread := w.body != nil && w.body.read != nil
	if code == http.StatusUnauthorized || code == http.StatusForbidden || (code >= 400 && unread) {
		w.Header().Set("Connection", "close")
		if unread {
			http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Now())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Flush is the response's: an answer streams only to a Flusher.
func (w *refusalCloses) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap is for http.ResponseController.
func (w *refusalCloses) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// timedBody is a request's body that clears its connection's read
// deadline once read to its end.
type timedBody struct {
	io.ReadCloser
	read func()
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.read != nil {
		b.read()
		b.read = nil
	}
	return n, err
}

// limitConns bounds the connections l has open at once to n: Accept
// waits for one to close past it.
func limitConns(l net.Listener, n int) net.Listener {
	return &connLimit{Listener: l, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

type connLimit struct {
	net.Listener
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (l *connLimit) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, free: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *connLimit) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// slotConn gives its place back when it is closed.
type slotConn struct {
	net.Conn
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.free()
	return err
}
