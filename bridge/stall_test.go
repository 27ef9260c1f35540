package bridge_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// One subscriber that subscribes and then never reads holds no one else
// up: while thousands of events of 64 KiB go out, a Kaimon subscriber
// (libzmq) gets every one, in order, and the stalled one is dropped and
// logged once, naming it. Before, the bus waited on the stalled one for
// ever: the others got nothing new, and what was published piled up in
// the coordinator's memory.
func TestBusStalledSubscriberHoldsNoOneUp(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	path := filepath.Join(t.TempDir(), "kaimon-events.sock")
	address := "ipc://" + path
	logged := &lockedBuffer{}
	sub := kaimonsub.Start(t, address)
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address,
		Logger: slog.New(slog.NewTextHandler(logged, nil)), Stall: 2 * time.Second})
	stalled := dialZMTPSubscriber(t, path, "agent:")

	env := func(i int) []byte {
		content := fmt.Sprintf("%06d ", i) + strings.Repeat("x", 64<<10)
		b, err := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(content)}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Both are subscribed once each has the first event; the stalled
	// one reads nothing after it.
	publish(t, js, "s1", 1, env(1))
	if r := kaimonsub.Next(t, sub, "event 1"); r.Data != string(env(1)) {
		t.Fatalf("event 1 is %.60q", r.Data)
	}
	stalled.SetReadDeadline(time.Now().Add(30 * time.Second))
	if m, err := readZMTPMessage(stalled); err != nil || len(m) != 2 || string(m[0]) != "agent:s1" {
		t.Fatalf("the stalled subscriber's first event: %q %v", m, err)
	}

	const n = 3000
	received := make(chan error, 1)
	go func() {
		for i := 2; i <= n; i++ {
			select {
			case r, ok := <-sub:
				if !ok || r.Error != "" {
					received <- fmt.Errorf("event %d: the subscriber exited or failed: %s", i, r.Error)
					return
				}
				if want := env(i); r.Data != string(want) {
					received <- fmt.Errorf("event %d is %.40q, want %.40q", i, r.Data, want)
					return
				}
			case <-time.After(30 * time.Second):
				received <- fmt.Errorf("event %d never reached the good subscriber", i)
				return
			}
		}
		received <- nil
	}()
	for i := 2; i <= n; i++ {
		publish(t, js, "s1", uint64(i), env(i))
	}
	if err := <-received; err != nil {
		t.Fatal(err)
	}

	// Dropped, and logged once (reading it before then would be
	// progress): what its socket holds, then the end of the stream.
	const drop = "dropped a bus subscriber that took nothing"
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logged.String(), drop); {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled subscriber was not dropped in 30s; the log:\n%s", logged.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stalled.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, stalled); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the bus did not close the stalled subscriber's connection: %v", err)
	}
	out := logged.String()
	if c := strings.Count(out, drop); c != 1 {
		t.Errorf("the stalled subscriber's drop was logged %d times; the log:\n%s", c, out)
	}
	// It is named: over ipc by its process.
	if want := fmt.Sprintf("peer-pid=%d", os.Getpid()); !strings.Contains(out, want) {
		t.Errorf("the drop does not name the stalled subscriber (%s); the log:\n%s", want, out)
	}
}

// dialZMTPSubscriber connects to the bus at path as a SUB that speaks
// ZMTP 3.0 by hand: greeting, READY, a subscription to prefix. It returns
// once the bus's greeting and READY are read; what it reads after that
// is the test's to decide.
func dialZMTPSubscriber(t *testing.T, path, prefix string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB")
	var out bytes.Buffer
	out.Write(greeting)
	out.Write([]byte{0x04, byte(len(ready))})
	out.Write(ready)
	out.Write([]byte{0x00, byte(1 + len(prefix)), 0x01})
	out.WriteString(prefix)
	if _, err := c.Write(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
		t.Fatalf("the bus's greeting: %v", err)
	}
	if f, _, err := readZMTPFrame(c); err != nil || f&0x04 == 0 {
		t.Fatalf("the bus's READY: flags %#x %v", f, err)
	}
	return c
}

// readZMTPFrame reads one frame: its flags and body.
func readZMTPFrame(r io.Reader) (byte, []byte, error) {
	var head [9]byte
	if _, err := io.ReadFull(r, head[:2]); err != nil {
		return 0, nil, err
	}
	size := uint64(head[1])
	if head[0]&0x02 != 0 {
		if _, err := io.ReadFull(r, head[2:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(head[1:])
	}
	if size > 64<<20 {
		return 0, nil, fmt.Errorf("a frame of %d bytes", size)
	}
	body := make([]byte, size)
	_, err := io.ReadFull(r, body)
	return head[0], body, err
}

// readZMTPMessage reads the frames of one message.
func readZMTPMessage(r io.Reader) ([][]byte, error) {
	var frames [][]byte
	for {
		f, body, err := readZMTPFrame(r)
		if err != nil {
			return frames, err
		}
		frames = append(frames, body)
		if f&0x01 == 0 {
			return frames, nil
		}
	}
}

// lockedBuffer is a buffer a logger and a test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A fabric that requires credentials refuses to publish the bus, which
// has none, off loopback over tcp; ipc and loopback addresses are taken.
func TestBusLoopbackOnlyRefusesTCPOffLoopback(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := natstest.Connect(t, b)
	for _, address := range []string{"tcp://0.0.0.0:9878", "tcp://:9878", "tcp://*:9878", "tcp://192.0.2.1:9878", "tcp://[::]:9878", "tcp://example.com:9878", "tcp://127.0.0.1"} {
		_, err := bridge.NewBus(bridge.BusConfig{Conn: nc, Address: address, LoopbackOnly: true})
		if err == nil || !strings.Contains(err.Error(), "no credentials") || !strings.Contains(err.Error(), "ipc://") {
			t.Errorf("%s with LoopbackOnly: %v", address, err)
		}
		if address == "tcp://127.0.0.1" {
			continue // no port: refused either way
		}
		if _, err := bridge.NewBus(bridge.BusConfig{Conn: nc, Address: address}); err != nil {
			t.Errorf("%s without LoopbackOnly: %v", address, err)
		}
	}
	for _, address := range []string{"tcp://127.0.0.1:9878", "tcp://localhost:9878", "tcp://[::1]:9878", "ipc:///tmp/kaimon-events.sock"} {
		if _, err := bridge.NewBus(bridge.BusConfig{Conn: nc, Address: address, LoopbackOnly: true}); err != nil {
			t.Errorf("%s with LoopbackOnly: %v", address, err)
		}
	}
}
