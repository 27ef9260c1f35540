package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// proxy is a sandboxed agent's one way out: an HTTP proxy on loopback
// (CONNECT for TLS, absolute-form requests for plain HTTP) that lets
// through only the hosts the agent may reach. The kernel refuses the
// agent's every other connect.
type proxy struct {
	ln    net.Listener
	allow []string // host or host:port, lower case
	log   *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  chan struct{}
}

// startProxy listens on a free loopback port.
func startProxy(allow []string, log *slog.Logger) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the sandbox's proxy: %w", err)
	}
	p := &proxy{ln: ln, log: log, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
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
		p.track(c, true)
		go func() {
			defer p.track(c, false)
			defer c.Close()
			p.handle(c)
		}()
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

// allowed reports whether target (host:port) may be reached.
func (p *proxy) allowed(target string) bool {
	target = strings.ToLower(target)
	host, _, _ := net.SplitHostPort(target)
	return slices.ContainsFunc(p.allow, func(a string) bool { return a == target || a == host })
}

// refuse answers a request for a host the agent may not reach.
func (p *proxy) refuse(c net.Conn, target string) {
	p.log.Warn("the sandbox refused a connection", "to", target)
	body := fmt.Sprintf("shoal sandbox: %s is not among the hosts this agent may reach (%s)\n", target, strings.Join(p.allow, ", "))
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// handle serves one client connection: a CONNECT tunnel, or plain HTTP
// requests one after another.
func (p *proxy) handle(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
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
		up, err := (&net.Dialer{Timeout: 30 * time.Second}).DialContext(context.Background(), "tcp", target)
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
