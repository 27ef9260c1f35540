package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// BusReader reads a Kaimon bus the way a Kaimon extension does: a ZeroMQ
// SUB socket subscribed to every "agent:" channel. shoal bench measures
// the bus with it.
type BusReader struct {
	sub    zmq4.Socket
	cancel context.CancelFunc
}

// ReadBus dials the bus at address (ipc:// or tcp://), retrying until the
// bus has bound it.
func ReadBus(ctx context.Context, address string) (*BusReader, error) {
	if _, _, err := splitEndpoint(address); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(10*time.Millisecond), zmq4.WithDialerMaxRetries(1000))
	if err := sub.Dial(address); err != nil {
		cancel()
		return nil, fmt.Errorf("dial the bus at %s: %w", address, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "agent:"); err != nil {
		sub.Close()
		cancel()
		return nil, err
	}
	return &BusReader{sub: sub, cancel: cancel}, nil
}

// Next is the next message: its channel ("agent:<id>") and its payload,
// the Julia-serialized NamedTuple holding the event's JSON text.
func (r *BusReader) Next() (channel string, payload []byte, err error) {
	m, err := r.sub.Recv()
	if err != nil {
		return "", nil, err
	}
	if len(m.Frames) != 2 {
		return "", nil, fmt.Errorf("a bus message of %d frames, want 2", len(m.Frames))
	}
	return string(m.Frames[0]), m.Frames[1], nil
}

// Close ends the subscription.
func (r *BusReader) Close() error {
	err := r.sub.Close()
	r.cancel()
	return err
}

// RawZMQ is the baseline a bus is measured against: it binds a plain
// zmq4 PUB socket at address, waits for one BusReader's subscription,
// sends it frames (channel, payload) as fast as it can and returns the
// messages per second the reader received, every one of them.
func RawZMQ(ctx context.Context, address string, frames [][2][]byte) (float64, error) {
	if len(frames) == 0 {
		return 0, errors.New("no frames to send")
	}
	if err := claim(address); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.SetOption(zmq4.OptionHWM, len(frames)+1); err != nil {
		return 0, err
	}
	if err := pub.Listen(address); err != nil {
		return 0, fmt.Errorf("bind %s: %w", address, err)
	}
	r, err := ReadBus(ctx, address)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	topics, _ := pub.(zmq4.Topics)
	for deadline := time.Now().Add(10 * time.Second); topics != nil && len(topics.Topics()) == 0; {
		if time.Now().After(deadline) {
			return 0, errors.New("the raw zmq4 subscriber did not subscribe in 10s")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		for _, f := range frames {
			if err := pub.Send(zmq4.NewMsgFrom(f[0], f[1])); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for i := range frames {
		if _, _, err := r.Next(); err != nil {
			return 0, fmt.Errorf("raw zmq4 message %d of %d: %w", i+1, len(frames), err)
		}
	}
	rate := float64(len(frames)) / time.Since(start).Seconds()
	if err := <-sent; err != nil {
		return 0, fmt.Errorf("raw zmq4 send: %w", err)
	}
	return rate, nil
}
