package bridge

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"
)

// A peer that connects to the bus and leaves before its greeting (as the
// bus's own probe of a live address does) leaves nothing behind: zmq4
// abandons such a connection unclosed, and its sender must not wait on it
// for ever. Not parallel: it looks at every goroutine.
func TestBusConnectionGoneBeforeItsGreetingIsClosed(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	path := filepath.Join(t.TempDir(), "bus.sock")
	pub, logged := loggingPub(t)
	defer pub.Close()
	if err := pub.Listen(batchAddress("ipc://" + path)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		// The bus greets first: once its signature is read, the bus has
		// taken the connection and waits for the peer's.
		if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	pub.Close()
	// A peer that leaves is no peer that misbehaved: nothing to log.
	if out := logged.String(); out != "" {
		t.Errorf("peers that left before greeting were logged as dropped:\n%s", out)
	}
	// zmq4 (v0.17.0) leaves a PUB socket's writer goroutine behind when
	// the socket closes; that one is the library's.
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// Peers that do not speak ZMTP, or speak it to harm, are dropped and keep
// nobody out: one that never greets (zmq4 greets in its accept loop, so
// it kept every later subscriber out), one that sends an HTTP request,
// and one that greets and then claims a frame of a terabyte (zmq4
// allocates what a frame claims before reading it). A real subscriber
// connecting after them gets what the bus publishes. Not parallel: it
// shortens the handshake's time limit and looks at every goroutine.
func TestBusDropsPeersThatDoNotSpeakZMTP(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer func(d time.Duration) { handshakeTimeout = d }(handshakeTimeout)
	handshakeTimeout = 300 * time.Millisecond
	path := filepath.Join(t.TempDir(), "bus.sock")
	pub, logged := loggingPub(t)
	defer pub.Close()
	if err := pub.Listen(batchAddress("ipc://" + path)); err != nil {
		t.Fatal(err)
	}
	dial := func(send []byte) net.Conn {
		t.Helper()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(send); err != nil {
			t.Fatal(err)
		}
		return c
	}
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xff, 0x7f, 3, 0
	copy(greeting[12:], "NULL")
	huge := append(append([]byte(nil), greeting...), 0x06, 0, 0, 1, 0, 0, 0, 0, 0) // a long command of 2^40 bytes
	peers := map[string]net.Conn{
		"silent":           dial(nil),
		"an HTTP request":  dial([]byte("GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: probe\r\nAccept: */*\r\n\r\n")),
		"a terabyte frame": dial(huge),
	}

	sub := zmq4.NewSub(t.Context())
	defer sub.Close()
	if err := sub.Dial("ipc://" + path); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	got := make(chan zmq4.Msg, 1)
	go func() {
		m, err := sub.Recv()
		if err == nil {
			got <- m
		}
		close(got)
	}()
	deadline := time.After(20 * time.Second)
	for waiting := true; waiting; {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("agent.x"), []byte("hello"))); err != nil {
			t.Fatal(err)
		}
		select {
		case m, ok := <-got:
			if !ok || string(m.Frames[1]) != "hello" {
				t.Fatalf("the subscriber got %v", m)
			}
			waiting = false
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("a subscriber connecting after the bad peers got nothing in 20s")
		}
	}
	for what, c := range peers {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		// Dropped: the end of the stream, or a reset when the bus
		// closed with what the peer sent unread.
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the bus did not drop the peer that sent %s: %v", what, err)
		}
	}
	sub.Close()
	pub.Close()
	// Each drop is logged once, saying why: an operator can tell a
	// subscriber the bus dropped from one that left.
	out := logged.String()
	for what, why := range map[string]string{
		"silent":           `why="no greeting within 300ms"`,
		"an HTTP request":  `why="its greeting is not ZMTP 3's with the NULL mechanism"`,
		"a terabyte frame": `why="a frame of 1099511627776 bytes, more than 65536"`,
	} {
		if n := strings.Count(out, why); n != 1 {
			t.Errorf("the peer that sent %s was logged %d times with %s; the log:\n%s", what, n, why, out)
		}
	}
	if n := strings.Count(out, "dropped a bus peer that does not speak ZMTP"); n != len(peers) {
		t.Errorf("%d drops logged for %d bad peers (the real subscriber is not one); the log:\n%s", n, len(peers), out)
	}
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// loggingPub is a PUB socket whose listener logs the peers it drops, and
// that log.
func loggingPub(t *testing.T) (zmq4.Socket, *logBuffer) {
	logged := &logBuffer{}
	return zmq4.NewPub(withPeerLog(t.Context(), slog.New(slog.NewTextHandler(logged, nil)))), logged
}

// logBuffer is a buffer a logger and a test share.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Over tcp the drop names the peer's address, so an operator can find it.
// Not parallel: it shortens the handshake's time limit.
func TestBusNamesADroppedTCPPeer(t *testing.T) {
	defer func(d time.Duration) { handshakeTimeout = d }(handshakeTimeout)
	handshakeTimeout = 200 * time.Millisecond
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pub, logged := loggingPub(t)
	defer pub.Close()
	if err := pub.Listen(batchAddress("tcp://" + addr)); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the bus did not drop a silent tcp peer: %v", err)
	}
	want := "peer=" + c.LocalAddr().String()
	if out := logged.String(); !strings.Contains(out, `why="no greeting within 200ms"`) || !strings.Contains(out, want) {
		t.Errorf("the drop of a silent tcp peer was not logged with why and %s; the log:\n%s", want, out)
	}
}
