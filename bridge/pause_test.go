package bridge_test

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/kaimonsub"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A Kaimon extension that stops reading for a few seconds (compiling its
// first handler, say) while a burst goes out keeps its place and gets
// every event, in order, once it reads again: libzmq (its receive mark
// 1000 messages, as ZMQ.jl's) stops reading the connection while the
// extension does not, and the bus took that for a dead subscriber after
// 2 s and dropped it, far below the marks at which it drops messages.
func TestBusKeepsASubscriberThatPausesAWhile(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	_, js := natstest.JetStream(t, b)
	address := "ipc://" + filepath.Join(t.TempDir(), "kaimon-events.sock")
	logged := &lockedBuffer{}
	sub, proc := kaimonsub.StartProcess(t, address)
	runBus(t, bridge.BusConfig{Conn: natstest.Connect(t, b), Address: address, Logger: slog.New(slog.NewTextHandler(logged, nil))})
	env := func(i int) []byte {
		b, err := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(fmt.Sprintf("%06d ", i) + strings.Repeat("x", 1000))}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	publish(t, js, "s1", 1, env(1))
	kaimonsub.Next(t, sub, "event 1")

	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for i := 2; i <= n; i++ {
		publish(t, js, "s1", uint64(i), env(i))
	}
	time.Sleep(5 * time.Second) // the pause, the burst sent
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= n; i++ {
		if m := kaimonsub.Next(t, sub, fmt.Sprintf("event %d", i)); m.Data != string(env(i)) {
			t.Fatalf("event %d is %.20q, want %.20q; the log:\n%s", i, m.Data, env(i), logged.String())
		}
	}
	if strings.Contains(logged.String(), "dropped") {
		t.Errorf("the bus dropped something of a subscriber that paused; the log:\n%s", logged.String())
	}
}
