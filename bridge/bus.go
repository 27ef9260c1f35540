package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// BusConfig configures the Kaimon bus. Conn and Address are required.
type BusConfig struct {
	// Conn reaches the fabric.
	Conn *nats.Conn
	// Address is where the ZeroMQ PUB socket binds, e.g. Kaimon's
	// ipc://<cache>/kaimon/sock/kaimon-events.sock or tcp://127.0.0.1:9878.
	Address string
	// Durable names the JetStream consumer that feeds the bus; "shoal-bus"
	// when empty. A restarted bus resumes where it stopped.
	Durable string
	// StateFile keeps the stream sequence of the last event sent, so a
	// restart repeats nothing; none when empty. An event being sent when
	// the bus is killed may be lost, like anything a dying PUB socket
	// had queued.
	StateFile string
	// HWM is how many messages may wait for one subscriber before new
	// ones are dropped for it (ZeroMQ's send high-water mark, which
	// libzmq keeps per subscriber); 100000 when zero.
	HWM int
	// HWMBytes is how many bytes may wait for one subscriber before new
	// messages are dropped for it; 128 MiB when zero.
	HWMBytes int
	// Grace is how long a starting bus waits for a subscriber to
	// (re)connect before it sends what it missed, and for a previous
	// bus's pull requests on Durable to go; 2s when zero.
	Grace time.Duration
	// Stall is how long a subscriber may take nothing of what waits for
	// it before it is dropped; a minute when zero.
	Stall time.Duration
	// DrainWait is how long a stopping bus lets its subscribers take
	// what waits for them; 5s when zero.
	DrainWait time.Duration
	// JuliaVersion is the Serialization header's version byte;
	// DefaultJuliaVersion when zero.
	JuliaVersion byte
	// Replay makes a new durable start from the oldest event the stream
	// keeps; by default it starts with the events published from then on.
	Replay bool
	// Agents limits the bus to these agents' events; every agent's when
	// empty.
	Agents []string
	// LoopbackOnly refuses a tcp Address off loopback: the bus has no
	// credentials and carries every agent's prompts and tool output to
	// whoever connects, so it is not published to the network.
	LoopbackOnly bool
	Logger       *slog.Logger
}

// Bus republishes every agent event onto Kaimon's ZeroMQ bus: two frames,
// the channel "agent:<id>" and the Julia-serialized NamedTuple
// (channel, data, session_name = "agent") where data is the envelope's
// JSON text, byte-compatible with Kaimon extensions.
type Bus struct {
	cfg BusConfig
	log *slog.Logger
}

// NewBus checks cfg.
func NewBus(cfg BusConfig) (*Bus, error) {
	if cfg.Conn == nil {
		return nil, errors.New("the bus needs a NATS connection")
	}
	network, addr, err := splitEndpoint(cfg.Address)
	if err != nil {
		return nil, err
	}
	if network == "tcp" && cfg.LoopbackOnly {
		if host, _, err := net.SplitHostPort(addr); err != nil || !isLoopbackHost(host) {
			return nil, fmt.Errorf("refusing to publish the Kaimon bus on %s: the bus has no credentials and carries every agent's prompts and tool output to whoever connects; give an ipc:// address, or a loopback one such as tcp://127.0.0.1:9878", cfg.Address)
		}
	}
	if cfg.Durable == "" {
		cfg.Durable = "shoal-bus"
	}
	for _, id := range cfg.Agents {
		if err := schemas.ValidID(id); err != nil {
			return nil, fmt.Errorf("bus agent %w", err)
		}
	}
	if cfg.HWM == 0 {
		cfg.HWM = defaultHWM
	}
	if cfg.HWMBytes == 0 {
		cfg.HWMBytes = defaultHWMBytes
	}
	if cfg.Grace == 0 {
		cfg.Grace = 2 * time.Second
	}
	if cfg.DrainWait == 0 {
		cfg.DrainWait = 5 * time.Second
	}
	if cfg.JuliaVersion == 0 {
		cfg.JuliaVersion = DefaultJuliaVersion
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Bus{cfg: cfg, log: cfg.Logger.With("component", "bus", "address", cfg.Address)}, nil
}

func splitEndpoint(ep string) (network, addr string, err error) {
	network, addr, ok := strings.Cut(ep, "://")
	if !ok || addr == "" || (network != "ipc" && network != "tcp") {
		return "", "", fmt.Errorf("bus address %q is not ipc://<path> or tcp://<host>:<port>", ep)
	}
	return network, addr, nil
}

// Run binds the bus and feeds it until ctx ends. ready, when not nil, is
// closed once the bus is bound and consuming.
func (b *Bus) Run(ctx context.Context, ready chan<- struct{}) error {
	if err := claim(b.cfg.Address); err != nil {
		return err
	}
	// The socket's context outlives ctx: a bus that stops lets its
	// subscribers take what waits for them before it closes them.
	live := &liveConns{}
	sockCtx, closeSock := context.WithCancel(context.WithoutCancel(ctx))
	defer closeSock()
	pub := zmq4.NewPub(withPeers(sockCtx, peers{log: b.log, hwm: b.cfg.HWM, hwmBytes: b.cfg.HWMBytes, stall: b.cfg.Stall, live: live}))
	defer pub.Close()
	// zmq4's one queue for the socket, ahead of each subscriber's own:
	// a message waits in it only until it is copied for each subscriber,
	// who never makes it wait (batchConn).
	if err := pub.SetOption(zmq4.OptionHWM, b.cfg.HWM); err != nil {
		return err
	}
	if err := pub.Listen(batchAddress(b.cfg.Address)); err != nil {
		return fmt.Errorf("bind the Kaimon bus at %s: %w", b.cfg.Address, err)
	}
	bound := time.Now()
	if network, path, _ := splitEndpoint(b.cfg.Address); network == "ipc" {
		defer os.Remove(path)
	}

	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	pos, err := openPosition(b.cfg.StateFile, info.Created)
	if err != nil {
		return err
	}
	defer pos.close()
	if last := info.State.LastSeq; pos.last > last {
		// Its position says it sent events the stream does not have:
		// the store was put back from an older copy. What the stream
		// takes next is sent; waiting for it to pass the position would
		// send nothing until then.
		b.log.Warn("the bus's position is past the stream's end (a store restored from an older copy?); it sends what the stream takes from now on",
			"position", pos.last, "stream-last", last)
		pos.record(last)
	}
	cons, err := b.consumer(ctx, stream, pos.last)
	if err != nil {
		return err
	}
	b.awaitSubscriber(ctx, pub, bound)
	// Acknowledging one event acknowledges all before it, so the bus acks
	// every ackEvery events and whenever it has caught up; the position
	// file keeps a restart from repeating the few it had not acked.
	const ackEvery = 256
	unacked := 0
	b.log.Info("Kaimon bus live", "resuming-after", pos.last)
	failed := make(chan error, 1)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	// Only an agent's events go out, in its order; what else is on its
	// subject is passed over and logged.
	order := client.NewOrder(b.cfg.Conn)
	strays := 0
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			msg.Ack()
			return
		}
		if seq := meta.Sequence.Stream; seq > pos.last {
			evs, err := order.Add(ctx, msg)
			if err != nil {
				fail(fmt.Errorf("read the stream: %w", err))
				return
			}
			// Recorded before ZeroMQ has the event, which it may deliver
			// at once: a bus killed right after must not send it again.
			prev := pos.last
			pos.record(seq)
			for _, r := range evs {
				if r.Stray != "" {
					if strays++; strays <= 100 || strays%1000 == 0 {
						b.log.Warn("passed over a message on an agent's subject that is not one of its events",
							"agent", r.Agent, "seq", r.Seq, "why", r.Stray, "strays", strays)
					}
					continue
				}
				channel := "agent:" + r.Agent
				payload := JuliaNamedTuple(channel, string(r.Raw), "agent", b.cfg.JuliaVersion)
				if err := pub.Send(zmq4.NewMsgFrom([]byte(channel), payload)); err != nil {
					pos.record(prev)
					fail(fmt.Errorf("send on the Kaimon bus: %w", err))
					return
				}
			}
		}
		if unacked++; unacked >= ackEvery || meta.NumPending == 0 {
			msg.Ack()
			unacked = 0
		}
	}, jetstream.PullMaxMessages(1024))
	if err != nil {
		return err
	}
	defer func() {
		cc.Stop()
		<-cc.Closed() // no callback runs once Run returns
	}()
	if ready != nil {
		close(ready)
	}
	select {
	case <-ctx.Done():
		// What was recorded as sent waits for some subscriber still:
		// nothing more is sent, and each may take what waits for it
		// (a restart resumes after it, and does not send it again).
		cc.Stop()
		<-cc.Closed()
		drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.DrainWait)
		defer cancel()
		if left := live.drain(drainCtx, b.cfg.DrainWait); left > 0 {
			b.log.Warn("the bus stopped with messages its subscribers had not taken; they are not sent again", "messages", left, "waited", b.cfg.DrainWait)
		}
		return nil
	case err := <-failed:
		return err
	}
}

// consumer opens the bus's durable consumer, creating it to start with
// the events published from now on: the bus is live, not a replay of the
// whole history. An existing one is rewound to resume where the last bus
// stopped. A bus that has sent events of this stream before (last, from
// its position file) and finds no durable (its name changed, as a
// cluster member's did, or it was removed) starts after the last it sent.
func (b *Bus) consumer(ctx context.Context, stream jetstream.Stream, last uint64) (jetstream.Consumer, error) {
	cons, err := stream.Consumer(ctx, b.cfg.Durable)
	if err == nil {
		return cons, b.rewind(ctx, stream, cons)
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("open consumer %s: %w", b.cfg.Durable, err)
	}
	deliver, start := jetstream.DeliverNewPolicy, uint64(0)
	switch {
	case b.cfg.Replay:
		deliver = jetstream.DeliverAllPolicy
	case last > 0:
		deliver, start = jetstream.DeliverByStartSequencePolicy, last+1
	}
	filter := []string{schemas.EventSubjects}
	if len(b.cfg.Agents) > 0 {
		filter = filter[:0]
		for _, id := range b.cfg.Agents {
			filter = append(filter, schemas.EventSubject(id))
		}
	}
	return stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:        b.cfg.Durable,
		Description:    "Shoal's Kaimon ZeroMQ bus",
		FilterSubjects: filter,
		DeliverPolicy:  deliver,
		OptStartSeq:    start,
		AckPolicy:      jetstream.AckAllPolicy,
		AckWait:        30 * time.Second,
		MaxAckPending:  8192,
	})
}

// rewind makes the durable deliver again, in order, every event a previous
// bus was handed and did not acknowledge: those it held when it was
// killed, and any the server handed to a pull request of a dead bus
// before it noticed the connection was gone. Left alone, JetStream would
// redeliver them only after AckWait, behind the newer events this bus is
// handed at once, and acknowledging one of those (AckAll) would drop
// them. Rewound to the ack floor, the bus is handed them first; the
// position file skips the ones already sent.
//
// A pull request the server still holds for the durable would be handed
// events after the rewind: a dead bus's lasts until the server notices
// its connection is gone. rewind gives such requests up to the grace
// period to go and warns of one that stays, most likely another bus
// sharing the durable, which takes a share of the events.
func (b *Bus) rewind(ctx context.Context, stream jetstream.Stream, cons jetstream.Consumer) error {
	deadline := time.Now().Add(b.cfg.Grace)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", b.cfg.Durable, err)
		}
		if info.NumWaiting == 0 {
			break
		}
		if !time.Now().Before(deadline) {
			b.log.Warn("another client pulls the bus's consumer; the events it is handed never reach this bus",
				"durable", b.cfg.Durable, "pull-requests", info.NumWaiting)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := stream.ResetConsumer(ctx, b.cfg.Durable); err != nil {
		return fmt.Errorf("rewind consumer %s to its ack floor: %w", b.cfg.Durable, err)
	}
	return nil
}

// reconnectWindow is how long after the bus binds the subscribers of the
// bus it replaces have to be back: libzmq retries every 100 ms, with up to
// 100 ms of jitter, each subscriber on its own.
const reconnectWindow = 300 * time.Millisecond

// awaitSubscriber gives subscribers up to the grace period to connect
// before the bus sends anything, since a PUB socket drops what it sends
// before a subscription arrives. The first subscription is not enough:
// what was stored while no bus ran goes out at once, and a subscriber
// whose reconnection comes a moment later would never be sent it.
func (b *Bus) awaitSubscriber(ctx context.Context, pub zmq4.Socket, bound time.Time) {
	topics, ok := pub.(zmq4.Topics)
	if !ok {
		return
	}
	deadline := time.Now().Add(b.cfg.Grace)
	for (len(topics.Topics()) == 0 || time.Since(bound) < reconnectWindow) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// claim makes sure no live process is bound at the address: a stale ipc
// socket file is removed; one that answers is someone else's.
func claim(address string) error {
	network, addr, err := splitEndpoint(address)
	if err != nil {
		return err
	}
	if network == "tcp" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("the Kaimon bus address %s is in use: %w", address, err)
		}
		return l.Close()
	}
	if err := os.MkdirAll(filepath.Dir(addr), 0o700); err != nil {
		return fmt.Errorf("bus socket directory: %w", err)
	}
	fi, err := os.Lstat(addr)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("the Kaimon bus address %s exists and is not a socket; refusing to replace it", address)
	}
	conn, err := net.DialTimeout("unix", addr, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("the Kaimon bus address %s is in use by a live process (Kaimon, or another shoal up); give the bus another address (shoal up --bus ADDRESS), or run none (--no-bus)", address)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("the Kaimon bus address %s: %w", address, err)
	}
	return os.Remove(addr) // a stale socket left by a process that died
}

// position is the last stream sequence the bus sent, kept in a file that
// survives the bus being killed, and tied to the stream's creation time
// so a recreated stream is not mistaken for the old one.
type position struct {
	f       *os.File
	created int64
	last    uint64
}

func openPosition(path string, created time.Time) (*position, error) {
	p := &position{created: created.UnixNano()}
	if path == "" {
		return p, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bus state file: %w", err)
	}
	p.f = f
	var buf [16]byte
	if n, _ := f.ReadAt(buf[:], 0); n == 16 && int64(binary.LittleEndian.Uint64(buf[:8])) == p.created {
		p.last = binary.LittleEndian.Uint64(buf[8:])
	}
	return p, nil
}

func (p *position) record(seq uint64) {
	p.last = seq
	if p.f == nil {
		return
	}
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(p.created))
	binary.LittleEndian.PutUint64(buf[8:], seq)
	p.f.WriteAt(buf[:], 0)
}

func (p *position) close() {
	if p.f != nil {
		p.f.Close()
	}
}
