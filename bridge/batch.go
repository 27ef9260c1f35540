package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

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

// Listen is given the context the socket was made with: the bus puts in
// it the logger that names the peers it drops (withPeerLog).
func (t batchTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	log, _ := ctx.Value(peerLogKey{}).(*slog.Logger)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return batchListener{l, log}, nil
}

type peerLogKey struct{}

// withPeerLog makes the context for a socket whose listener logs, on log,
// each peer it drops for not speaking ZMTP.
func withPeerLog(ctx context.Context, log *slog.Logger) context.Context {
	return context.WithValue(ctx, peerLogKey{}, log)
}

type batchListener struct {
	net.Listener
	log *slog.Logger
}

func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// zmq4 greets each peer in its accept loop, with no time limit: a
	// peer that never finishes its greeting would keep every later
	// subscriber out.
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	return newBatchConn(c, l.log), nil
}

// handshakeTimeout is how long a peer has to greet the bus, and how long
// a connection zmq4 has stopped reading is kept.
var handshakeTimeout = 10 * time.Second

// maxPeerFrame bounds a frame a peer sends the bus: its greeting's
// command and its subscriptions are small, and zmq4 allocates whatever
// size a frame claims before reading it.
const maxPeerFrame = 64 << 10

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

	peer    zmtpReader  // what the peer has sent, read as ZMTP; only Read touches it
	reading int         // Reads under way
	idle    *time.Timer // closes a connection no Read has begun on for handshakeTimeout
	log     *slog.Logger
}

func newBatchConn(c net.Conn, log *slog.Logger) *batchConn {
	b := &batchConn{Conn: c, log: log}
	b.cond = sync.NewCond(&b.mu)
	b.idle = time.AfterFunc(handshakeTimeout, b.abandoned)
	go b.send()
	return b
}

// abandoned closes the connection if nothing reads it. zmq4 reads every
// connection it keeps all the time (a PUB socket waits for
// subscriptions), and leaves a connection whose greeting fails without
// closing it, which would keep its socket and its sender for ever.
func (b *batchConn) abandoned() {
	b.mu.Lock()
	gone := b.reading == 0 && !b.closed
	b.mu.Unlock()
	if gone {
		b.drop("its greeting was refused, or it stopped being read")
	}
}

// drop closes a connection whose peer does not speak ZMTP, and says why.
func (b *batchConn) drop(why string) {
	b.mu.Lock()
	already := b.closed
	b.mu.Unlock()
	if !already {
		args := []any{"why", why}
		if a := b.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
			args = append(args, "peer", a.String())
		}
		b.log.Warn("dropped a bus peer that does not speak ZMTP", args...)
	}
	b.Close()
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

// Read reads what the peer sends, as ZMTP: a frame claiming more than
// maxPeerFrame is an error, and the handshake's deadline is lifted once
// the peer's greeting and first command are in. A failed read closes the
// connection (zmq4 closes a connection it keeps on a failed read itself,
// and abandons one whose greeting fails).
func (b *batchConn) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.reading++
	b.idle.Stop()
	b.mu.Unlock()
	n, err := b.Conn.Read(p)
	greeted := b.peer.greeted()
	ferr := b.peer.feed(p[:n])
	switch {
	case ferr != nil:
		n, err = 0, ferr
		b.drop(ferr.Error())
	case !greeted && b.peer.greeted():
		b.Conn.SetReadDeadline(time.Time{})
	case !greeted && errors.Is(err, os.ErrDeadlineExceeded):
		b.drop(fmt.Sprintf("no greeting within %s", handshakeTimeout))
	}
	if err != nil {
		b.Close()
	}
	b.mu.Lock()
	b.reading--
	if b.reading == 0 && !b.closed {
		b.idle.Reset(handshakeTimeout)
	}
	b.mu.Unlock()
	return n, err
}

// Close drops what is not sent yet, as a closing PUB socket does.
func (b *batchConn) Close() error {
	b.mu.Lock()
	b.closed = true
	b.idle.Stop()
	b.cond.Broadcast()
	b.mu.Unlock()
	return b.Conn.Close()
}

// zmtpReader follows the bytes a peer sends: the 64-byte greeting, then
// frames (a flags byte, a size of one byte or, when the flags say long,
// eight, and the body).
type zmtpReader struct {
	greeting int // greeting bytes read
	frames   int // frames read whole
	head     [9]byte
	headLen  int
	body     uint64 // body bytes still to come
}

const zmtpGreeting = 64

// greeted reports whether the greeting and the first command (the
// handshake's READY) are in.
func (z *zmtpReader) greeted() bool { return z.greeting == zmtpGreeting && z.frames > 0 }

// feed takes the next bytes the peer sent; an error when a frame claims
// more than maxPeerFrame.
func (z *zmtpReader) feed(p []byte) error {
	for len(p) > 0 {
		switch {
		case z.greeting < zmtpGreeting:
			k := min(zmtpGreeting-z.greeting, len(p))
			z.greeting += k
			p = p[k:]
		case z.body > 0:
			k := min(z.body, uint64(len(p)))
			z.body -= k
			p = p[k:]
			if z.body == 0 {
				z.frames++
			}
		default:
			z.head[z.headLen] = p[0]
			z.headLen++
			p = p[1:]
			long := z.head[0]&0x02 != 0
			var size uint64
			switch {
			case !long && z.headLen == 2:
				size = uint64(z.head[1])
			case long && z.headLen == 9:
				size = binary.BigEndian.Uint64(z.head[1:9])
			default:
				continue
			}
			if size > maxPeerFrame {
				return fmt.Errorf("a frame of %d bytes, more than %d", size, maxPeerFrame)
			}
			z.headLen, z.body = 0, size
			if size == 0 {
				z.frames++
			}
		}
	}
	return nil
}
