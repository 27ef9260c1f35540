package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/schemas"
)

// busRun is a Kaimon bus on the fabric, as shoal up runs one, with a
// ZeroMQ subscriber reading it.
type busRun struct {
	conn    *nats.Conn
	durable string
	cancel  context.CancelFunc
	done    chan error // the bus's Run
	read    chan error // the reader's loop
	reader  *bridge.BusReader
	got     atomic.Int64
	ready   time.Time // when the bus began sending
	stopped sync.Once
}

// startBus runs a bus named name (its durable consumer and socket) for
// agents (every agent when nil), from the stream's start with replay or
// from now on, and reads it, handing each message to fn on the reader's
// goroutine. Its send high-water mark is hwm (the bus's default when 0):
// a PUB socket drops what a slow subscriber leaves past it.
func startBus(ctx context.Context, url, dir, name string, agents []string, replay bool, hwm int, fn func(channel string, payload []byte)) (*busRun, error) {
	nc, err := nats.Connect(url, nats.Name("shoal bench bus "+name))
	if err != nil {
		return nil, err
	}
	address := "ipc://" + filepath.Join(dir, "bus-"+name+".sock")
	durable := fmt.Sprintf("bench-%s-%d", name, os.Getpid())
	bus, err := bridge.NewBus(bridge.BusConfig{Conn: nc, Address: address, Durable: durable, Agents: agents, Replay: replay, HWM: hwm,
		Grace: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	b := &busRun{conn: nc, durable: durable, cancel: cancel, done: make(chan error, 1), read: make(chan error, 1)}
	ready := make(chan struct{})
	go func() { b.done <- bus.Run(ctx, ready) }()
	b.reader, err = bridge.ReadBus(ctx, address)
	if err != nil {
		b.stop()
		return nil, err
	}
	select {
	case <-ready:
		b.ready = time.Now()
	case err := <-b.done:
		b.done <- err
		b.stop()
		return nil, fmt.Errorf("the Kaimon bus did not start: %v", err)
	case <-time.After(30 * time.Second):
		b.stop()
		return nil, errors.New("the Kaimon bus did not start in 30s")
	}
	go func() {
		for {
			channel, payload, err := b.reader.Next()
			if err != nil {
				b.read <- err
				return
			}
			b.got.Add(1)
			if fn != nil {
				fn(channel, payload)
			}
		}
	}()
	return b, nil
}

// stop ends the bus and its reader and deletes its durable consumer; a
// second stop does nothing.
func (b *busRun) stop() { b.stopped.Do(b.stopOnce) }

func (b *busRun) stopOnce() {
	b.cancel()
	if b.reader != nil {
		b.reader.Close()
	}
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
	}
	if js, err := jetstream.New(b.conn); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		js.DeleteConsumer(ctx, schemas.StreamName, b.durable)
		cancel()
	}
	b.conn.Close()
}

// drainBus runs a fresh bus over the agents' stored events, want of
// them, and returns how many its subscriber received and at what rate,
// from the bus's start to the last.
func drainBus(ctx context.Context, url, dir string, agents []string, want int64) (int64, float64, error) {
	var last atomic.Int64
	b, err := startBus(ctx, url, dir, "drain", agents, true, int(want)+1, func(string, []byte) { last.Store(time.Now().UnixNano()) })
	if err != nil {
		return 0, 0, err
	}
	defer b.stop()
	if err := waitFor(ctx, func() int64 {
		select {
		case err := <-b.read:
			b.read <- err
			return -1
		default:
			return b.got.Load()
		}
	}, want, func() string {
		return fmt.Sprintf("the bus's subscriber received %d of %d events", b.got.Load(), want)
	}); err != nil {
		return b.got.Load(), 0, err
	}
	if got := b.got.Load(); got != want {
		return got, 0, fmt.Errorf("the bus's subscriber received %d events, want %d", got, want)
	}
	took := time.Duration(last.Load() - b.ready.UnixNano())
	if took <= 0 {
		return want, 0, errors.New("the bus delivered in no time")
	}
	return want, float64(want) / took.Seconds(), nil
}

// busFrames is n bus messages of agent id made of envelopes, cycled: what
// the bus sends for them.
func busFrames(id string, envelopes [][]byte, n int) [][2][]byte {
	channel := []byte("agent:" + id)
	payloads := make([][]byte, len(envelopes))
	for i, e := range envelopes {
		payloads[i] = bridge.JuliaNamedTuple(string(channel), string(e), "agent", bridge.DefaultJuliaVersion)
	}
	out := make([][2][]byte, n)
	for i := range out {
		out[i] = [2][]byte{channel, payloads[i%len(payloads)]}
	}
	return out
}
