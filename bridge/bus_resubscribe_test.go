package bridge_test

import (
	"path/filepath"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/natstest"
)

// What is stored while the bus is down (shoal up stops its bus before its
// server, so a node's event can be stored in between) is sent by the
// restarted bus at once. Every subscriber of the stopped bus reconnects
// (libzmq: 100-200 ms apart, its reconnect interval and jitter); each
// must be sent it, not only the first whose subscription arrives.
func TestBusRestartSendsBacklogToEverySubscriber(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	dir := t.TempDir()
	address := "ipc://" + filepath.Join(dir, "kaimon-events.sock")
	cfg := bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, StateFile: filepath.Join(dir, "bus.pos")}
	subs := []<-chan kaimonsub.Message{kaimonsub.Start(t, address), kaimonsub.Start(t, address)}
	stop := runBus(t, cfg)
	envs := fabrictest.TurnEnvelopes(t)
	n := 0
	pub := func() {
		publish(t, js, "9f3a1c20", uint64(n+1), envs[n])
		n++
	}
	expect := func(round int) {
		for i, sub := range subs {
			t.Logf("round %d: subscriber %d waits for event %d", round, i, n)
			m := kaimonsub.Next(t, sub, "an event")
			if m.Data != string(envs[n-1]) {
				t.Fatalf("round %d: subscriber %d was sent event %d, not event %d", round, i, index(envs, m.Data)+1, n)
			}
		}
	}
	pub()
	expect(0)
	for round := 1; round <= 6 && n+2 <= len(envs); round++ {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		pub() // stored while the bus is down
		stop = runBus(t, cfg)
		pub() // stored once the bus is back
		for i, sub := range subs {
			if m := kaimonsub.Next(t, sub, "an event"); m.Data != string(envs[n-2]) {
				t.Fatalf("round %d: subscriber %d missed event %d, stored while the bus was down; it was next sent event %d", round, i, n-1, index(envs, m.Data)+1)
			}
		}
		expect(round)
	}
}

func index(envs [][]byte, data string) int {
	for i, e := range envs {
		if string(e) == data {
			return i
		}
	}
	return -2
}
