package bridge

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The bus's PUB socket binds through these transports: the same ipc and
// tcp sockets, the same bytes on the wire, but each subscriber's
// connection gathers what zmq4 writes (a system call per message) and
// sends it in as few writes as the subscriber takes. Under a burst that
// is a write per batch, not per event; alone, an event goes out at once.
const (
	batchIPC = "shoal-ipc"
	batchTCP = "shoal-tcp"
)

func init() {
	for name, network := range map[string]string{batchIPC: "unix", batchTCP: "tcp"} {
		if err := zmq4.RegisterTransport(name, batchTransport{transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// batchAddress is where the bus binds for address, an ipc:// or tcp://
// endpoint.
func batchAddress(address string) string {
	if rest, ok := strings.CutPrefix(address, "ipc://"); ok {
		return batchIPC + "://" + rest
	}
	if rest, ok := strings.CutPrefix(address, "tcp://"); ok {
		return batchTCP + "://" + rest
	}
	return address
}

type batchTransport struct{ transport.Transport }

func (t batchTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return batchListener{l}, nil
}

type batchListener struct{ net.Listener }

func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newBatchConn(c), nil
}

// batchLimit is how much a connection gathers before a write waits for
// the subscriber to take some: what a slow subscriber can hold up.
const batchLimit = 1 << 20

// batchConn is a connection whose writes are gathered and sent by a
// goroutine of its own: a write copies its bytes and returns, unless
// batchLimit bytes wait already; the first error sending them is
// returned by the writes after it.
type batchConn struct {
	net.Conn

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte // gathered, not yet sent
	spare  []byte // the storage last sent, for the next gathering
	err    error
	closed bool
}

func newBatchConn(c net.Conn) *batchConn {
	b := &batchConn{Conn: c}
	b.cond = sync.NewCond(&b.mu)
	go b.send()
	return b
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.buf) >= batchLimit && b.err == nil && !b.closed {
		b.cond.Wait()
	}
	switch {
	case b.err != nil:
		return 0, b.err
	case b.closed:
		return 0, net.ErrClosed
	}
	b.buf = append(b.buf, p...)
	b.cond.Broadcast()
	return len(p), nil
}

// send writes what is gathered, as it gathers, until the connection is
// closed or a write fails.
func (b *batchConn) send() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		for len(b.buf) == 0 && !b.closed {
			b.cond.Wait()
		}
		if b.closed {
			return
		}
		out := b.buf
		b.buf, b.spare = b.spare[:0], nil
		b.mu.Unlock()
		_, err := b.Conn.Write(out)
		b.mu.Lock()
		if err != nil {
			b.err = err
			b.cond.Broadcast()
			return
		}
		if cap(out) <= batchLimit {
			b.spare = out
		}
		b.cond.Broadcast()
	}
}

// Read closes the connection when reading it fails: zmq4 leaves a
// connection whose greeting fails (a probe of the address, a peer gone
// at once) without closing it, which would keep its socket and its
// sender for ever; zmq4 closes any other on a failed read itself.
func (b *batchConn) Read(p []byte) (int, error) {
	n, err := b.Conn.Read(p)
	if err != nil {
		if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
			b.Close()
		}
	}
	return n, err
}

// Close drops what is not sent yet, as a closing PUB socket does.
func (b *batchConn) Close() error {
	b.mu.Lock()
	b.closed = true
	b.cond.Broadcast()
	b.mu.Unlock()
	return b.Conn.Close()
}
