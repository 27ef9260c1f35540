package bridge

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
)

// A subscriber that falls behind by a high-water mark, of messages or of
// bytes, has whole messages dropped: what waits for it stays within the
// mark (and one message), what it gets is the greeting, the READY
// command and whole messages in order, split wherever zmq4 splits its
// writes; once it has caught up it gets messages again. Falling behind
// is logged once a minute at most. Not parallel: it lengthens the time a subscriber may take
// nothing.
func TestBusDropsWholeMessagesForASubscriberFarBehind(t *testing.T) {
	defer func(s, h time.Duration) { stallTimeout, handshakeTimeout = s, h }(stallTimeout, handshakeTimeout)
	stallTimeout, handshakeTimeout = time.Minute, time.Minute
	for _, tc := range []struct {
		what string
		cfg  peers
	}{
		{"messages", peers{hwm: 20, hwmBytes: 1 << 30}},
		{"bytes", peers{hwm: 1 << 20, hwmBytes: 256 << 10}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			logged := &logBuffer{}
			tc.cfg.log = slog.New(slog.NewTextHandler(logged, nil))
			server, client := unixPair(t)
			b := newBatchConn(server, tc.cfg)
			defer b.Close()

			greeting := make([]byte, 64)
			greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
			copy(greeting[12:], "NULL")
			ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
			b.Write(greeting[:10]) // the greeting in two writes
			b.Write(greeting[10:])
			b.Write([]byte{0x04, byte(len(ready))})
			b.Write(ready)
			const n, size = 2000, 4 << 10
			send := func(i int) {
				body := fmt.Appendf(nil, "%06d %s", i, strings.Repeat("x", size))
				b.Write([]byte{0x01, 7})
				b.Write([]byte("agent:x"))
				head := make([]byte, 9)
				head[0] = 0x02
				binary.BigEndian.PutUint64(head[1:], uint64(len(body)))
				b.Write(head[:3]) // a header in two writes
				b.Write(head[3:])
				b.Write(body)
			}
			message := int64(2 + 7 + 9 + 7 + size)
			for i := range n {
				send(i)
				b.mu.Lock()
				msgs, waiting := len(b.ends), b.added-b.taken
				b.mu.Unlock()
				if msgs > tc.cfg.hwm || waiting > int64(tc.cfg.hwmBytes)+message {
					t.Fatalf("after message %d, %d messages and %d bytes wait; the marks are %d and %d",
						i, msgs, waiting, tc.cfg.hwm, tc.cfg.hwmBytes)
				}
			}

			b.mu.Lock()
			kept := b.added
			b.mu.Unlock()
			client.SetReadDeadline(time.Now().Add(30 * time.Second))
			r := &countingReader{r: client}
			if got := make([]byte, 64); !readFull(t, r, got) || !bytes.Equal(got, greeting) {
				t.Fatalf("the greeting arrived as %q", got)
			}
			if flags, body := readFrame(t, r); flags != 0x04 || !bytes.Equal(body, ready) {
				t.Fatalf("READY arrived as %#x %q", flags, body)
			}
			// What waited arrives whole and in order, fewer than were sent;
			// then, caught up, the subscriber gets the next one.
			got, last := 0, -1
			for last != n {
				if r.n == kept {
					// The subscriber has what was kept; once the bus has seen
					// its writes end (it counts what was taken when a write
					// returns, after the reader may have read it all), it
					// is caught up.
					poll.Until(t, 30*time.Second, "the bus to count what the subscriber took", func() bool {
						b.mu.Lock()
						defer b.mu.Unlock()
						return b.taken == kept
					})
					send(n)
				}
				if flags, topic := readFrame(t, r); flags != 0x01 || string(topic) != "agent:x" {
					t.Fatalf("after message %d, a first frame %#x %q", last, flags, topic)
				}
				flags, body := readFrame(t, r)
				var i int
				if _, err := fmt.Sscanf(string(body), "%06d ", &i); err != nil || flags != 0x02 || len(body) != 7+size || i <= last {
					t.Fatalf("after message %d, a second frame %#x of %d bytes: %.20q", last, flags, len(body), body)
				}
				got, last = got+1, i
			}
			if got > n {
				t.Fatalf("all %d messages arrived; none was dropped", got)
			}
			out := logged.String()
			if c := strings.Count(out, "fell too far behind"); c != 1 {
				t.Errorf("falling behind logged %d times; the log:\n%s", c, out)
			}
			t.Logf("%d of %d messages arrived", got, n+1)
		})
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// unixPair is the two ends of a unix socket connection.
func unixPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

func readFull(t *testing.T, r io.Reader, p []byte) bool {
	t.Helper()
	if _, err := io.ReadFull(r, p); err != nil {
		t.Fatal(err)
	}
	return true
}

// readFrame reads one ZMTP frame.
func readFrame(t *testing.T, r io.Reader) (byte, []byte) {
	t.Helper()
	head := make([]byte, 9)
	readFull(t, r, head[:2])
	size := uint64(head[1])
	if head[0]&zmtpLong != 0 {
		readFull(t, r, head[2:])
		size = binary.BigEndian.Uint64(head[1:])
	}
	if size > 1<<20 {
		t.Fatalf("a frame of %d bytes: the stream is cut", size)
	}
	body := make([]byte, size)
	readFull(t, r, body)
	return head[0], body
}

// The bus decides to drop a message as it begins, once for the whole
// message, whatever size the writes carrying it have: never the
// greeting, never a command, never part of a message.
func TestZMTPSenderDecidesOncePerMessage(t *testing.T) {
	t.Parallel()
	var stream, want bytes.Buffer
	greeting := make([]byte, 64)
	greeting[0] = 0xff
	stream.Write(greeting)
	want.Write(greeting)
	command := []byte{0x04, 6, 5, 'R', 'E', 'A', 'D', 'Y'}
	stream.Write(command)
	want.Write(command)
	const messages = 6
	for i := range messages {
		var m bytes.Buffer
		m.Write([]byte{0x01, 7})
		m.WriteString("agent:x")
		m.Write([]byte{0x01, 0}) // an empty frame
		body := bytes.Repeat([]byte{byte('a' + i)}, 300)
		m.Write([]byte{0x02, 0, 0, 0, 0, 0, 0, 1, 44})
		m.Write(body)
		stream.Write(m.Bytes())
		if i%2 == 1 {
			want.Write(m.Bytes())
		}
	}
	for _, size := range []int{1, 2, 7, 100, stream.Len()} {
		var z zmtpSender
		var kept bytes.Buffer
		asked, ended := 0, 0
		drop := func() bool { asked++; return asked%2 == 1 } // drop every other message
		p := stream.Bytes()
		for len(p) > 0 {
			w := p[:min(size, len(p))]
			p = p[len(w):]
			for len(w) > 0 {
				n, dropped, end := z.step(w, drop)
				if !dropped {
					kept.Write(w[:n])
				}
				if end {
					ended++
				}
				w = w[n:]
			}
		}
		if asked != messages || ended != messages || !bytes.Equal(kept.Bytes(), want.Bytes()) {
			t.Errorf("writes of %d bytes: asked %d times, %d messages ended, kept %d bytes (want %d of %d messages, %d bytes)",
				size, asked, ended, kept.Len(), messages, messages, want.Len())
		}
	}
}
