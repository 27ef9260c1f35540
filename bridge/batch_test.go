package bridge

import (
	"io"
	"net"
	"path/filepath"
	"testing"

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
	pub := zmq4.NewPub(t.Context())
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
	// zmq4 (v0.17.0) leaves a PUB socket's writer goroutine behind when
	// the socket closes; that one is the library's.
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
