package bridge

import (
	"bytes"
	"context"
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
// it the logger that names the peers it drops and the marks past which a
// subscriber's messages are dropped (withPeers).
func (t batchTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	cfg, _ := ctx.Value(peersKey{}).(peers)
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if cfg.hwm <= 0 {
		cfg.hwm = defaultHWM
	}
	if cfg.hwmBytes <= 0 {
		cfg.hwmBytes = defaultHWMBytes
	}
	return newBatchListener(l, cfg), nil
}

// peers is what a socket's listener does with its peers.
type peers struct {
	log      *slog.Logger  // names each peer it drops
	hwm      int           // messages that may wait for one subscriber
	hwmBytes int           // bytes that may wait for one subscriber
	stall    time.Duration // how long a subscriber may take nothing; stallTimeout when zero
	live     *liveConns    // the connections open, when the socket drains them
}

// stallAfter is how long a subscriber may take nothing of what waits for
// it before it is dropped.
func (p peers) stallAfter() time.Duration {
	if p.stall > 0 {
		return p.stall
	}
	return stallTimeout
}

// liveConns are a socket's open connections, for a bus that stops to let
// its subscribers take what waits for them first.
type liveConns struct {
	mu    sync.Mutex
	conns map[*batchConn]struct{}
}

func (l *liveConns) add(b *batchConn) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		l.conns = map[*batchConn]struct{}{}
	}
	l.conns[b] = struct{}{}
}

func (l *liveConns) remove(b *batchConn) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, b)
}

// waiting is how many messages wait for the open connections, all told.
func (l *liveConns) waiting() int {
	l.mu.Lock()
	conns := make([]*batchConn, 0, len(l.conns))
	for b := range l.conns {
		conns = append(conns, b)
	}
	l.mu.Unlock()
	n := 0
	for _, b := range conns {
		b.mu.Lock()
		if !b.closed && b.err == nil {
			n += len(b.ends)
		}
		b.mu.Unlock()
	}
	return n
}

// drain waits, up to within, until nothing waits for any open
// connection (twice in a row, for what the socket's own queue was still
// copying), and returns how many messages still wait.
func (l *liveConns) drain(ctx context.Context, within time.Duration) int {
	deadline := time.Now().Add(within)
	empty := 0
	for {
		n := l.waiting()
		if n == 0 {
			if empty++; empty == 2 {
				return 0
			}
		} else {
			empty = 0
		}
		if !time.Now().Before(deadline) {
			return n
		}
		select {
		case <-ctx.Done():
			return n
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type peersKey struct{}

// withPeers makes the context for a socket whose listener treats its
// peers as cfg says; a zero field takes its default.
func withPeers(ctx context.Context, cfg peers) context.Context {
	return context.WithValue(ctx, peersKey{}, cfg)
}

// withPeerLog makes the context for a socket whose listener logs, on log,
// each peer it drops.
func withPeerLog(ctx context.Context, log *slog.Logger) context.Context {
	return withPeers(ctx, peers{log: log})
}

// batchListener hands zmq4 only peers that have greeted. zmq4 greets
// each peer in its accept loop, one after another: a peer that never
// finished its greeting kept every later subscriber out until its time
// ran out, and K silent connections kept them out K times as long. So
// the listener greets each peer on a goroutine of its own, at most
// maxGreeting at once, and zmq4 is given a connection once the peer's
// greeting and first command (its READY) are in: zmq4's own handshake
// then reads them at once.
type batchListener struct {
	net.Listener
	cfg      peers
	ready    chan *batchConn
	greeting chan struct{} // a place per greeting under way
	done     chan struct{}
	once     sync.Once
}

// maxGreeting bounds the greetings under way at once; past it a new
// connection waits to be accepted.
const maxGreeting = 256

func newBatchListener(l net.Listener, cfg peers) *batchListener {
	bl := &batchListener{Listener: l, cfg: cfg, ready: make(chan *batchConn), greeting: make(chan struct{}, maxGreeting), done: make(chan struct{})}
	go bl.admitAll()
	return bl
}

// admitAll accepts connections until the listener closes, and greets
// each.
func (l *batchListener) admitAll() {
	for {
		select {
		case l.greeting <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.greeting
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select { // too many open files, say: a moment, then again
			case <-time.After(50 * time.Millisecond):
				continue
			case <-l.done:
				return
			}
		}
		c.SetReadDeadline(time.Now().Add(handshakeTimeout))
		go func() {
			defer func() { <-l.greeting }()
			b := newBatchConn(c, l.cfg)
			if !b.greet() {
				return
			}
			select {
			case l.ready <- b:
				b.given()
			case <-l.done:
				b.Close()
			}
		}()
	}
}

func (l *batchListener) Accept() (net.Conn, error) {
	select {
	case b := <-l.ready:
		return b, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *batchListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// handshakeTimeout is how long a peer has to greet the bus, and how long
// a connection zmq4 has stopped reading is kept.
var handshakeTimeout = 10 * time.Second

// stallTimeout is how long a subscriber may take nothing of what waits
// for it before it is dropped: a dead one's bytes (up to its marks) are
// freed then. Long, since a living libzmq subscriber takes nothing for a
// while in its stride: once its receive mark of messages (1000 by
// default) waits in it, libzmq reads its connection again only after the
// extension has taken half, which a reader of ten events a second does
// in 50 s, and an extension pauses (compiling its first handler) for
// seconds. Kaimon's own bus drops no subscriber for its pace.
var stallTimeout = time.Minute

// maxPeerFrame bounds a frame a peer sends the bus: its greeting's
// command and its subscriptions are small, and zmq4 allocates whatever
// size a frame claims before reading it.
const maxPeerFrame = 64 << 10

// The marks past which a subscriber that falls behind has messages
// dropped, when the bus sets none: libzmq's send high-water mark, which
// it keeps per subscriber, at ten times Kaimon's 10,000, and a bound on
// the bytes.
const (
	defaultHWM      = 100000
	defaultHWMBytes = 128 << 20
)

// chunkLimit is about how much one write to a subscriber carries: what
// waits for it is kept in chunks of this size, each sent in one write
// and freed (or reused) once sent.
const chunkLimit = 1 << 20

// batchConn is a connection whose writes are gathered and sent by a
// goroutine of its own, so zmq4, which sends each message to every
// subscriber in turn, never waits for one: a write copies its bytes and
// returns. A subscriber that falls behind by the high-water marks has
// whole messages dropped (never the greeting or a command, never part of
// a message) until what waits is down to half the marks; one that takes
// nothing for stallTimeout is dropped. The first error sending is
// returned by the writes after it.
type batchConn struct {
	net.Conn
	cfg peers

	mu      sync.Mutex
	cond    *sync.Cond
	chunks  [][]byte // gathered, not yet taken by the sender, in order
	spare   []byte   // a chunk sent, for the next gathering
	out     zmtpSender
	added   int64     // bytes gathered (dropped ones not counted)
	taken   int64     // bytes the subscriber has taken
	ends    []int64   // where the messages not taken yet end, in added
	behind  bool      // messages are dropped until it catches up
	dropped int       // messages dropped since the last warning
	warned  time.Time // when falling behind was last logged
	err     error
	closed  bool

	peer    zmtpReader  // what the peer has sent, read as ZMTP; only greet and Read touch it
	pre     []byte      // what greet read of the peer, for zmq4's reads
	swallow []byte      // what is left of zmq4's greeting, which greet sent for it
	reading int         // Reads under way
	idle    *time.Timer // closes a connection no Read has begun on for handshakeTimeout
	log     *slog.Logger
}

func newBatchConn(c net.Conn, cfg peers) *batchConn {
	b := &batchConn{Conn: c, cfg: cfg, log: cfg.log.With(peerArgs(c)...)}
	b.cond = sync.NewCond(&b.mu)
	cfg.live.add(b)
	b.idle = time.AfterFunc(handshakeTimeout, b.abandoned)
	go b.send()
	return b
}

// peerArgs names the peer of c for the log: over tcp its address, over
// ipc (where the system tells) its process.
func peerArgs(c net.Conn) []any {
	if a := c.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return []any{"peer", a.String()}
	}
	return peerProcess(c)
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
		b.log.Warn("dropped a bus peer that does not speak ZMTP", "why", why)
	}
	b.Close()
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.err != nil:
		return 0, b.err
	case b.closed:
		return 0, net.ErrClosed
	}
	n := len(p)
	if k := min(len(b.swallow), len(p)); k > 0 {
		// zmq4's greeting, which greet sent already.
		if !bytes.Equal(p[:k], b.swallow[:k]) {
			return 0, errors.New("zmq4 greeted otherwise than the bus did for it")
		}
		b.swallow, p = b.swallow[k:], p[k:]
	}
	for len(p) > 0 {
		k, dropped, ended := b.out.step(p, b.full)
		if !dropped {
			b.gather(p[:k])
			if ended {
				b.ends = append(b.ends, b.added)
			}
		} else if ended {
			b.dropped++
		}
		p = p[k:]
	}
	b.cond.Broadcast()
	return n, nil
}

// full reports, as a message begins, whether the subscriber is too far
// behind to be sent it: once it has reached a high-water mark, until
// what waits is down to half of both. Falling behind is logged at most once
// a minute, with how many messages were dropped since the last time.
func (b *batchConn) full() bool {
	msgs, bytes := len(b.ends), b.added-b.taken
	switch {
	case !b.behind && (msgs >= b.cfg.hwm || bytes >= int64(b.cfg.hwmBytes)):
		b.behind = true
		if now := time.Now(); now.Sub(b.warned) >= behindWarnEvery {
			b.warned = now
			b.log.Warn("a bus subscriber fell too far behind; dropping its messages until it catches up",
				"waiting-messages", msgs, "waiting-bytes", bytes, "dropped-since-last-warning", b.dropped)
			b.dropped = 0
		}
	case b.behind && msgs <= b.cfg.hwm/2 && bytes <= int64(b.cfg.hwmBytes/2):
		b.behind = false
	}
	return b.behind
}

// behindWarnEvery is how often a subscriber falling behind is logged at
// most.
const behindWarnEvery = time.Minute

// gather adds p to what waits for the subscriber.
func (b *batchConn) gather(p []byte) {
	n := len(b.chunks)
	if n == 0 || len(b.chunks[n-1]) >= chunkLimit {
		b.chunks = append(b.chunks, b.spare[:0])
		b.spare = nil
		n++
	}
	b.chunks[n-1] = append(b.chunks[n-1], p...)
	b.added += int64(len(p))
}

// send writes what is gathered, as it gathers, a chunk at a time, until
// the connection is closed, a write fails, or the subscriber takes
// nothing for stallTimeout.
func (b *batchConn) send() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		for len(b.chunks) == 0 && !b.closed {
			b.cond.Wait()
		}
		if b.closed {
			return
		}
		out := b.chunks[0]
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
		b.mu.Unlock()
		err := b.write(out)
		b.mu.Lock()
		if err != nil {
			b.err = err
			b.cond.Broadcast()
			if errors.Is(err, os.ErrDeadlineExceeded) && !b.closed {
				b.log.Warn(fmt.Sprintf("dropped a bus subscriber that took nothing for %s", b.cfg.stallAfter()),
					"waiting-messages", len(b.ends), "waiting-bytes", b.added-b.taken)
				b.mu.Unlock()
				b.Close()
				b.mu.Lock()
			}
			return
		}
		if cap(out) <= 2*chunkLimit {
			b.spare = out
		}
	}
}

// write sends out, and fails with os.ErrDeadlineExceeded once the
// subscriber has taken none of it for stallTimeout: a write that sends
// some is progress.
func (b *batchConn) write(out []byte) error {
	for len(out) > 0 {
		b.Conn.SetWriteDeadline(time.Now().Add(b.cfg.stallAfter()))
		n, err := b.Conn.Write(out)
		out = out[n:]
		if n > 0 {
			b.mu.Lock()
			b.taken += int64(n)
			i := 0
			for i < len(b.ends) && b.ends[i] <= b.taken {
				i++
			}
			b.ends = b.ends[i:]
			b.mu.Unlock()
		}
		if err != nil && (n == 0 || !errors.Is(err, os.ErrDeadlineExceeded)) {
			return err
		}
	}
	return nil
}

// Read reads what the peer sends, as ZMTP: a frame claiming more than
// maxPeerFrame is an error, and the handshake's deadline is lifted once
// the peer's greeting and first command are in. A failed read closes the
// connection (zmq4 closes a connection it keeps on a failed read itself,
// and abandons one whose greeting fails).
func (b *batchConn) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.idle.Stop()
	if len(b.pre) > 0 {
		// What greet read: the peer's greeting and first command.
		n := copy(p, b.pre)
		b.pre = b.pre[n:]
		if len(b.pre) == 0 {
			b.pre = nil
		}
		if b.reading == 0 && !b.closed {
			b.idle.Reset(handshakeTimeout)
		}
		b.mu.Unlock()
		return n, nil
	}
	b.reading++
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

// zmq4Greeting is the greeting zmq4 (v0.17.0) sends as a PUB socket's
// listener, ZMTP 3.0 with the NULL mechanism, which greet sends for it.
var zmq4Greeting = func() []byte {
	g := make([]byte, zmtpGreeting)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}()

// greet sends the bus's greeting and reads the peer's greeting and first
// command, up to handshakeTimeout; false when the peer left or was
// dropped meanwhile (a peer that leaves before greeting is not logged:
// the bus's own probe of a live address does that).
func (b *batchConn) greet() bool {
	b.idle.Stop()
	if _, err := b.Write(zmq4Greeting); err != nil {
		b.Close()
		return false
	}
	b.mu.Lock()
	b.swallow = zmq4Greeting
	b.mu.Unlock()
	buf := make([]byte, 4096)
	for !b.peer.greeted() {
		n, err := b.Conn.Read(buf)
		before := b.peer.greeting
		if ferr := b.peer.feed(buf[:n]); ferr != nil {
			b.drop(ferr.Error())
			return false
		}
		if before < 12 && b.peer.greeting >= 12 && !zmtpSignature(append(b.pre, buf[:n]...)) {
			b.drop("its greeting is not ZMTP 3's with the NULL mechanism")
			return false
		}
		b.mu.Lock()
		b.pre = append(b.pre, buf[:n]...)
		b.mu.Unlock()
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			b.drop(fmt.Sprintf("no greeting within %s", handshakeTimeout))
			return false
		case !b.peer.greeted():
			b.Close() // it left
			return false
		}
	}
	b.Conn.SetReadDeadline(time.Time{})
	return true
}

// given is called once zmq4 has the connection: one it abandons (its
// greeting refused) is closed after handshakeTimeout unread.
func (b *batchConn) given() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed && b.reading == 0 {
		b.idle.Reset(handshakeTimeout)
	}
}

// zmtpSignature reports whether g, a peer's first 12 bytes or more,
// begins a ZMTP greeting of version 3 or later.
func zmtpSignature(g []byte) bool {
	return len(g) >= 12 && g[0] == 0xff && g[9] == 0x7f && g[10] >= 3
}

// Close drops what is not sent yet, as a closing PUB socket does.
func (b *batchConn) Close() error {
	b.cfg.live.remove(b)
	b.mu.Lock()
	b.closed = true
	b.idle.Stop()
	b.cond.Broadcast()
	b.mu.Unlock()
	return b.Conn.Close()
}
