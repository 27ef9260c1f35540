package bridge_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

func runBus(t *testing.T, cfg bridge.BusConfig) (stop func() error) {
	t.Helper()
	if cfg.Grace == 0 {
		// The subscriber is a process that a loaded machine may keep from
		// (re)connecting within the default 2s, and what the bus sends
		// before it has is lost; the bus goes on once it has.
		cfg.Grace = 30 * time.Second
	}
	bus, err := bridge.NewBus(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- bus.Run(ctx, ready) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("bus: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("bus not ready")
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { stop() })
	return stop
}

func publish(t *testing.T, js jetstream.JetStream, id string, n uint64, env []byte) {
	t.Helper()
	m := nats.NewMsg(schemas.EventSubject(id))
	m.Data = env
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, n))
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
}

// Every event of a turn reaches a libzmq subscriber in order, and decodes
// to (channel, data, session_name) exactly.
func TestBusDeliversTurnInOrder(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	address := "ipc://" + filepath.Join(t.TempDir(), "kaimon-events.sock")
	sub := kaimonsub.Start(t, address)
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: filepath.Join(t.TempDir(), "bus.pos")})

	envs := fabrictest.TurnEnvelopes(t)
	huge, _ := schemas.Encode(schemas.Event{Turn: 9, Payload: schemas.AssistantText{Content: schemas.Text(strings.Repeat("é", 40000))}})
	envs = append(envs, huge)
	for i, env := range envs {
		publish(t, js, "9f3a1c20", uint64(i+1), env)
	}
	for i, env := range envs {
		r := kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i+1))
		schematest.Event(t, []byte(r.Data))
		if r.Topic != "agent:9f3a1c20" || r.Channel != r.Topic || r.SessionName != "agent" || r.Data != string(env) {
			t.Fatalf("event %d: topic %q channel %q session %q data %.80q, want %.80q", i+1, r.Topic, r.Channel, r.SessionName, r.Data, env)
		}
	}
}

// The bus refuses to take over an address a live process is bound to,
// replaces a stale socket file, and will not replace anything else.
func TestBusClaimsItsAddress(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	address := "ipc://" + filepath.Join(dir, "live.sock")
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, Grace: time.Millisecond})
	second, _ := bridge.NewBus(bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address})
	err := second.Run(t.Context(), nil)
	if err == nil || !strings.Contains(err.Error(), "in use by a live process") {
		t.Fatalf("a second bus on a live address: %v", err)
	}

	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: "ipc://" + stale, Grace: time.Millisecond})

	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("keep me"), 0o600)
	third, _ := bridge.NewBus(bridge.BusConfig{Conn: natstest.Connect(t, b), Address: "ipc://" + plain})
	if err := third.Run(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("a regular file at the address: %v", err)
	}
	if b, _ := os.ReadFile(plain); string(b) != "keep me" {
		t.Fatal("the bus replaced a regular file")
	}

	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	fourth, _ := bridge.NewBus(bridge.BusConfig{Conn: natstest.Connect(t, b), Address: "tcp://" + l2.Addr().String()})
	if err := fourth.Run(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a taken tcp port: %v", err)
	}
	for _, bad := range []string{"", "inproc://x", "ipc://", "/tmp/x.sock"} {
		if _, err := bridge.NewBus(bridge.BusConfig{Conn: natstest.Connect(t, b), Address: bad}); err == nil {
			t.Errorf("address %q accepted", bad)
		}
	}
}

// busProcess runs a bus in this process until it is killed.
func busProcess() int {
	nc, err := nats.Connect(os.Getenv("SHOAL_TEST_NATS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Grace as runBus's: the subscriber reconnects to each bus started.
	bus, err := bridge.NewBus(bridge.BusConfig{Conn: nc, Address: os.Getenv("SHOAL_TEST_BUS_ADDRESS"), StateFile: os.Getenv("SHOAL_TEST_BUS_STATE"),
		Grace: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ready := make(chan struct{})
	go func() {
		<-ready
		fmt.Println("ready")
	}()
	if err := bus.Run(context.Background(), ready); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestMain(m *testing.M) {
	if os.Getenv("SHOAL_TEST_BUS") == "1" {
		os.Exit(busProcess())
	}
	// zmq4 (v0.17.0) leaves a PUB socket's writer goroutine behind when
	// the socket closes; that one is the library's.
	goleak.VerifyTestMain(m, append(natstest.KnownLeaks, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))...)
}

// The bus killed with SIGKILL mid-turn and restarted: the subscriber sees
// every event once, in order, nothing skipped and nothing repeated.
func TestBusKilledMidTurnResumes(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t, func(c *broker.Config) {})
	_, js := natstest.JetStream(t, b)
	dir := t.TempDir()
	address := "ipc://" + filepath.Join(dir, "kaimon-events.sock")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "SHOAL_TEST_BUS=1", "SHOAL_TEST_NATS="+b.ClientURL(),
			"SHOAL_TEST_BUS_ADDRESS="+address, "SHOAL_TEST_BUS_STATE="+filepath.Join(dir, "bus.pos"))
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("bus process: %q %v", line, err)
		}
		return cmd
	}
	sub := kaimonsub.Start(t, address)
	bus := start()
	current := bus

	envs := fabrictest.TurnEnvelopes(t)
	published := 0
	pub := func(n int) {
		for ; n > 0 && published < len(envs); n-- {
			published++
			publish(t, js, "k1", uint64(published), envs[published-1])
		}
	}
	var seen []string
	take := func(n int) {
		for range n {
			select {
			case r := <-sub:
				seen = append(seen, r.Data)
			case <-time.After(30 * time.Second):
				running := current.Process.Signal(syscall.Signal(0)) == nil
				t.Fatalf("event %d never reached the subscriber (published %d, bus process running: %v)", len(seen)+1, published, running)
			}
		}
	}
	pub(40)
	take(40)
	// Killed between events, mid-turn; the turn goes on while it is down.
	if err := bus.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bus.Wait()
	pub(30)
	current = start()
	pub(len(envs))
	take(len(envs) - 40)
	for i, env := range envs {
		if seen[i] != string(env) {
			t.Fatalf("event %d on the bus is %.60q, want %.60q", i+1, seen[i], env)
		}
		schematest.Event(t, []byte(seen[i]))
	}
	select {
	case r := <-sub:
		t.Fatalf("an extra event on the bus: %.80q", r.Data)
	case <-time.After(500 * time.Millisecond):
	}
}

// Events a bus was handed but never sent, because it died holding them,
// reach the subscriber from the next bus in order, before newer ones,
// although JetStream would redeliver them only after AckWait.
func TestBusResendsWhatADeadBusHeld(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	dir := t.TempDir()
	address := "ipc://" + filepath.Join(dir, "kaimon-events.sock")
	cfg := bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: filepath.Join(dir, "bus.pos")}
	sub := kaimonsub.Start(t, address)
	envs := fabrictest.TurnEnvelopes(t)[:6]
	expect := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			r := kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i+1))
			if r.Data != string(envs[i]) {
				t.Fatalf("event %d on the bus is %.60q, want %.60q", i+1, r.Data, envs[i])
			}
			schematest.Event(t, []byte(r.Data))
		}
	}

	stop := runBus(t, cfg)
	publish(t, js, "k1", 1, envs[0])
	publish(t, js, "k1", 2, envs[1])
	expect(0, 2)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(t.Context(), schemas.StreamName, "shoal-bus")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumWaiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped bus still pulls: %d requests", info.NumWaiting)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A bus that is handed events 3 and 4, then dies before sending or
	// acknowledging them.
	publish(t, js, "k1", 3, envs[2])
	publish(t, js, "k1", 4, envs[3])
	dead, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	deadJS, err := jetstream.New(dead)
	if err != nil {
		t.Fatal(err)
	}
	deadCons, err := deadJS.Consumer(t.Context(), schemas.StreamName, "shoal-bus")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := deadCons.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for range batch.Messages() {
		held++
	}
	if held != 2 {
		t.Fatalf("the dying bus was handed %d events, want 2 (%v)", held, batch.Error())
	}
	dead.Close()
	publish(t, js, "k1", 5, envs[4])
	publish(t, js, "k1", 6, envs[5])

	runBus(t, cfg)
	expect(2, 6)
	select {
	case r := <-sub:
		t.Fatalf("an extra event on the bus: %.80q", r.Data)
	case <-time.After(500 * time.Millisecond):
	}
}

// A bus that stops lets its subscribers take what waits for them before
// it closes: what it records as sent, a restart does not send again, and
// an outside review's subscriber, connected throughout, lost a third of a
// turn across a clean restart of the coordinator.
func TestBusStoppingLetsItsSubscribersTakeWhatWaits(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	address := "ipc://" + filepath.Join(t.TempDir(), "kaimon-events.sock")
	sub, proc := kaimonsub.StartProcess(t, address)
	// The subscriber stops reading for a while: it is not dropped for it.
	stop := runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: filepath.Join(t.TempDir(), "bus.pos"),
		DrainWait: 30 * time.Second, Stall: 2 * time.Minute})
	first, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("first")}})
	publish(t, js, "d1", 1, first)
	kaimonsub.Next(t, sub, "the first event")

	// The subscriber stops reading; what the bus sends it waits.
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	body := strings.Repeat("x", 2000)
	for i := 2; i <= n; i++ {
		env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text(fmt.Sprintf("%d %s", i, body))}})
		publish(t, js, "d1", uint64(i), env)
	}
	// The bus has sent them all before it stops: it acknowledges the last
	// once ZeroMQ has it (what its consumer was delivered but had not
	// sent yet is sent by the next bus, not this one).
	poll.Until(t, 30*time.Second, "the bus to send every event", func() bool {
		c, err := js.Consumer(t.Context(), schemas.StreamName, "shoal-bus")
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.AckFloor.Stream >= n
	})
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(500 * time.Millisecond) // stopping, with what waits
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= n; i++ {
		m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i))
		ev, err := schemas.Decode([]byte(m.Data))
		if err != nil {
			t.Fatal(err)
		}
		if got := ev.Payload.(schemas.AssistantText).Content.Text; !strings.HasPrefix(got, fmt.Sprintf("%d ", i)) {
			t.Fatalf("event %d: %.20q", i, got)
		}
	}
	if err := <-stopped; err != nil {
		t.Errorf("the bus: %v", err)
	}
}

// A bus that has sent events of the stream before and finds no durable
// of its name (a cluster member's bus, whose consumer is named for it
// since; a durable removed by hand) starts after the last event it sent,
// not with what is published from then on: the events published while
// it was away reach its subscribers.
func TestBusWithoutItsDurableResumesAfterItsLastEvent(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	address := "ipc://" + filepath.Join(t.TempDir(), "kaimon-events.sock")
	state := filepath.Join(t.TempDir(), "bus.pos")
	sub := kaimonsub.Start(t, address)
	text := func(s string) []byte {
		env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(s)}})
		return env
	}
	stop := runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: state, Durable: "shoal-bus"})
	for i := uint64(1); i <= 3; i++ {
		publish(t, js, "r1", i, text(fmt.Sprint(i)))
	}
	for i := 1; i <= 3; i++ {
		kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for i := uint64(4); i <= 6; i++ {
		publish(t, js, "r1", i, text(fmt.Sprint(i)))
	}
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: state, Durable: "shoal-bus-s1"})
	for i := 4; i <= 6; i++ {
		m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d, published while the bus was away", i))
		ev, err := schemas.Decode([]byte(m.Data))
		if err != nil {
			t.Fatal(err)
		}
		if got := ev.Payload.(schemas.AssistantText).Content.Text; got != fmt.Sprint(i) {
			t.Fatalf("event %d: %q", i, got)
		}
	}
}

// A bus whose position is past the stream's end (a store restored from an
// older copy beside a newer bus.pos) sends what the stream takes next:
// before, it passed over every event numbered up to the position it had
// recorded, and its subscribers heard nothing until the stream got there.
func TestBusPositionPastTheStreamsEndResumesAtTheEnd(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	address := "ipc://" + filepath.Join(t.TempDir(), "kaimon-events.sock")
	state := filepath.Join(t.TempDir(), "bus.pos")
	logged := &lockedBuffer{}
	sub := kaimonsub.Start(t, address)
	text := func(s string) []byte {
		env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(s)}})
		return env
	}
	stop := runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: state})
	for i := uint64(1); i <= 3; i++ {
		publish(t, js, "r1", i, text(fmt.Sprint(i)))
	}
	for i := 1; i <= 3; i++ {
		kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The position says 1000 events of this stream were sent.
	pos, err := os.ReadFile(state)
	if err != nil || len(pos) != 16 {
		t.Fatalf("bus.pos: %x %v", pos, err)
	}
	binary.LittleEndian.PutUint64(pos[8:], 1000)
	if err := os.WriteFile(state, pos, 0o600); err != nil {
		t.Fatal(err)
	}
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: state, Logger: slog.New(slog.NewTextHandler(logged, nil))})
	for i := uint64(4); i <= 6; i++ {
		publish(t, js, "r1", i, text(fmt.Sprint(i)))
	}
	for i := 4; i <= 6; i++ {
		m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d, after the position was found past the stream", i))
		if ev, err := schemas.Decode([]byte(m.Data)); err != nil || ev.Payload.(schemas.AssistantText).Content.Text != fmt.Sprint(i) {
			t.Fatalf("event %d: %s %v", i, m.Data, err)
		}
	}
	if !strings.Contains(logged.String(), "past the stream's end") {
		t.Errorf("the bus did not say its position was past the stream's end; the log:\n%s", logged.String())
	}
}
