package node

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// proxy is a sandboxed agent's one way out: an HTTP proxy on loopback
// (CONNECT for TLS, absolute-form requests for plain HTTP) that lets
// through only the hosts the agent may reach. The kernel refuses the
// agent's every other connect.
type proxy struct {
	ln    net.Listener
	allow []string // host or host:port, lower case
	log   *slog.Logger
	// mcp is the coordinator's MCP endpoint, reached only as this agent:
	// a request for a path on the proxy itself goes there, with the
	// agent's id and token set by the proxy, whatever the agent sent.
	mcp *mcpRoute

	// lookup resolves a host's name (the system's resolver).
	lookup func(ctx context.Context, host string) ([]net.IPAddr, error)

	// ctx ends with the proxy: dials in flight end with it.
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  chan struct{}
}

// mcpRoute is where, and as whom, the proxy sends an agent's MCP requests.
type mcpRoute struct {
	url     *url.URL
	agentID string
	token   string // the agent's own bearer token; "" when the endpoint needs none
}

// Limits on what an agent may make its proxy hold: a request's head, the
// time to send it, and connections at once.
const (
	proxyMaxHead  = 64 << 10
	proxyHeadWait = time.Minute
	proxyMaxConns = 256
)

// startProxy listens on a free loopback port.
// It lives until close, whatever becomes of ctx, which it keeps for its
// values.
func startProxy(ctx context.Context, allow []string, mcp *mcpRoute, log *slog.Logger) (*proxy, error) {
	return startProxyResolving(ctx, allow, mcp, log, net.DefaultResolver.LookupIPAddr)
}

// startProxyResolving is startProxy with names resolved by lookup.
func startProxyResolving(ctx context.Context, allow []string, mcp *mcpRoute, log *slog.Logger, lookup func(context.Context, string) ([]net.IPAddr, error)) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the sandbox's proxy: %w", err)
	}
	p := &proxy{ln: ln, log: log, mcp: mcp, conns: map[net.Conn]struct{}{}, done: make(chan struct{}), lookup: lookup}
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for _, a := range allow {
		if a = strings.ToLower(strings.TrimSpace(a)); a != "" && !slices.Contains(p.allow, a) {
			p.allow = append(p.allow, a)
		}
	}
	go p.serve()
	return p, nil
}

// addr is where the agent finds it.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// port is its TCP port.
func (p *proxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

// close stops it and every connection through it.
func (p *proxy) close() {
	p.cancel()
	p.ln.Close()
	<-p.done
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *proxy) serve() {
	defer close(p.done)
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c, true) {
			c.Close() // too many at once
			continue
		}
		go func() {
			defer p.track(c, false)
			defer c.Close()
			p.handle(c)
		}()
	}
}

// track counts a connection in or out; it refuses one past the limit.
func (p *proxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !on {
		delete(p.conns, c)
		return true
	}
	if len(p.conns) >= proxyMaxConns {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// self reports whether host names the proxy's own address (a client that
// sends even loopback requests through its proxy asks for it so).
func (p *proxy) self(host string) bool {
	_, port, err := net.SplitHostPort(host)
	h, _, _ := net.SplitHostPort(host)
	return err == nil && port == strconv.Itoa(int(p.port())) && (h == "127.0.0.1" || strings.EqualFold(h, "localhost"))
}

// allowed reports whether target (host:port) may be reached: an entry
// with a port allows that port, one without the web's, 443 and 80.
func (p *proxy) allowed(target string) bool {
	target = strings.ToLower(target)
	host, port, _ := net.SplitHostPort(target)
	return slices.ContainsFunc(p.allow, func(a string) bool {
		return a == target || (a == host && (port == "443" || port == "80"))
	})
}

// resolve finds the address to dial for target (host:port), which the
// allowlist lets through. A name that resolves to an address of this
// machine or its network's infrastructure (loopback, link-local, where
// clouds answer for instance metadata, unspecified) is refused unless the
// allowlist names that address itself, or "localhost": an allowed name
// is a host out there, and a DNS answer must not turn it into a way to
// the node's own services. The address checked is the one dialled, so a
// second answer cannot differ.
func (p *proxy) resolve(target string) (string, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil {
		return target, nil // an address the allowlist names as such
	}
	ips, err := p.lookup(p.ctx, host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("%s does not resolve: %v", host, err)
	}
	ip := ips[0].IP
	if inside(ip) && !strings.EqualFold(host, "localhost") && !p.allowed(net.JoinHostPort(ip.String(), port)) {
		return "", fmt.Errorf("%s resolves to %s, an address of this machine or its network (%s), which the agent's list does not name", host, ip, addressKind(ip))
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// inside reports whether ip is of this machine or its network's
// infrastructure rather than a host out there.
func inside(ip net.IP) bool {
	return ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() ||
		ip.IsInterfaceLocalMulticast() || ip.Equal(net.ParseIP("fd00:ec2::254"))
}

func addressKind(ip net.IP) string {
	switch {
	case ip.IsLoopback():
		return "loopback"
	case ip.Equal(net.IPv4(169, 254, 169, 254)), ip.Equal(net.ParseIP("fd00:ec2::254")):
		return "instance metadata"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "link-local"
	}
	return "unspecified"
}

// refuse answers a request for a host the agent may not reach.
func (p *proxy) refuse(c net.Conn, target string) {
	p.log.Warn("the sandbox refused a connection", "to", target)
	p.forbid(c, fmt.Sprintf("shoal sandbox: %s is not among the hosts this agent may reach (%s)\n", target, strings.Join(p.allow, ", ")))
}

// forbid answers 403 with body and ends the connection.
func (p *proxy) forbid(c net.Conn, body string) {
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// handle serves one client connection: a CONNECT tunnel, or plain HTTP
// requests one after another.
func (p *proxy) handle(c net.Conn) {
	// A request's head is read within a limit of size and time; what
	// follows it (a body, a tunnel) is not.
	lr := &io.LimitedReader{R: c, N: proxyMaxHead}
	br := bufio.NewReader(lr)
	for {
		lr.N = proxyMaxHead
		c.SetReadDeadline(time.Now().Add(proxyHeadWait))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		c.SetReadDeadline(time.Time{})
		lr.N = 1 << 62
		if req.Method != http.MethodConnect && (req.URL.Host == "" || p.self(req.URL.Host)) {
			// A request for the proxy itself: the MCP endpoint, as this
			// agent.
			if !p.toMCP(c, req) {
				return
			}
			continue
		}
		target := req.Host
		if req.Method != http.MethodConnect && req.URL.Host != "" {
			target = req.URL.Host
		}
		if _, _, err := net.SplitHostPort(target); err != nil {
			port := "80"
			if req.Method == http.MethodConnect || req.URL.Scheme == "https" {
				port = "443"
			}
			target = net.JoinHostPort(strings.Trim(target, "[]"), port)
		}
		if !p.allowed(target) {
			p.refuse(c, target)
			return
		}
		addr, err := p.resolve(target)
		if err != nil {
			p.log.Warn("the sandbox refused a connection", "to", target, "why", err)
			p.forbid(c, fmt.Sprintf("shoal sandbox: %v\n", err))
			return
		}
		up, err := (&net.Dialer{Timeout: 30 * time.Second}).DialContext(p.ctx, "tcp", addr)
		if err != nil {
			fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		}
		if req.Method == http.MethodConnect {
			fmt.Fprintf(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			p.tunnel(c, br, up)
			return
		}
		ok := p.forward(c, req, up)
		up.Close()
		if !ok {
			return
		}
	}
}

// tunnel copies both ways until either side ends.
func (p *proxy) tunnel(c net.Conn, br *bufio.Reader, up net.Conn) {
	p.track(up, true)
	defer p.track(up, false)
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(up, br)
		if t, ok := up.(*net.TCPConn); ok {
			t.CloseWrite()
		}
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
}

// toMCP forwards a request for the proxy's own address to the MCP
// endpoint with the agent's identity, reporting whether the client's
// connection may carry another.
func (p *proxy) toMCP(c net.Conn, req *http.Request) bool {
	if p.mcp == nil {
		p.refuse(c, "this proxy")
		return false
	}
	u := p.mcp.url
	if req.URL.Path != u.Path {
		// Only the MCP endpoint: the dashboard, its API and anything else
		// on that listener are no door of an agent's.
		p.log.Warn("the sandbox refused a path beside the MCP endpoint", "path", req.URL.Path)
		p.forbid(c, fmt.Sprintf("shoal sandbox: this proxy forwards only Shoal's MCP endpoint (%s), not %s: rule %s: %s\n",
			u.Path, req.URL.Path, schemas.RuleSideDoors, schemas.RuleSideDoors.Text()))
		return false
	}
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, u.Host
	req.Header.Del(schemas.AgentIDHeader)
	req.Header.Del("Authorization")
	req.Header.Set(schemas.AgentIDHeader, p.mcp.agentID)
	if p.mcp.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.mcp.token)
	}
	target := u.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(strings.Trim(target, "[]"), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
	}
	up, err := (&net.Dialer{Timeout: 30 * time.Second}).DialContext(p.ctx, "tcp", target)
	if err == nil && u.Scheme == "https" {
		tc := tls.Client(up, &tls.Config{ServerName: u.Hostname()})
		if err = tc.Handshake(); err != nil {
			up.Close()
		}
		up = tc
	}
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return false
	}
	defer up.Close()
	return p.forward(c, req, up)
}

// forward sends one plain HTTP request upstream and its response back,
// reporting whether the client's connection may carry another.
func (p *proxy) forward(c net.Conn, req *http.Request, up net.Conn) bool {
	p.track(up, true)
	defer p.track(up, false)
	req.RequestURI = ""
	req.Header.Del("Proxy-Connection")
	req.Header.Del("Proxy-Authorization")
	req.Close = true // one request per upstream connection
	if err := req.Write(up); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(up), req)
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return false
	}
	defer resp.Body.Close()
	// The client's connection goes on when the response's end is marked;
	// a body that ends with its connection ends the client's too.
	keep := resp.ContentLength >= 0 || len(resp.TransferEncoding) > 0
	resp.Close = !keep
	if err := resp.Write(c); err != nil {
		return false
	}
	return keep
}
