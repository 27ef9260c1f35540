// Package netproxy is a TCP proxy for tests: the network between a client
// or a node and the fabric, which a test freezes or cuts.
package netproxy

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target. Freeze stops it moving
// bytes either way without closing anything (a link that blackholes, as a
// dropped Wi-Fi, a NAT or a VM migration does: TCP keeps what was sent
// and delivers it when the path comes back); Thaw lets them go on. Cut
// closes every connection and refuses new ones (a partition that
// resets); Restore ends it.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	cutOff bool
	conns  []net.Conn
}

// Start forwards a loopback port of its own to target (host:port, or a
// nats:// URL) until the test ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{l: l, target: strings.TrimPrefix(target, "nats://")}
	p.cond = sync.NewCond(&p.mu)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			refuse := p.cutOff
			p.mu.Unlock()
			if refuse {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		p.Thaw()
		p.Cut()
	})
	return p
}

func (p *Proxy) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := to.Write(buf[:n]); werr != nil {
				from.Close()
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				from.Close()
			}
			to.Close()
			return
		}
	}
}

// URL is the proxy's address as a NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.l.Addr().String() }

// Freeze stops the bytes, closing nothing.
func (p *Proxy) Freeze() { p.mu.Lock(); p.frozen = true; p.mu.Unlock() }

// Thaw lets them go on.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Cut closes every connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cutOff = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

// Restore takes new connections again.
func (p *Proxy) Restore() { p.mu.Lock(); p.cutOff = false; p.mu.Unlock() }
