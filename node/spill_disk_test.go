package node

import (
	"context"
	"fmt"
	"log/slog"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// The disk fills while the fabric is away and the outbox spills (the
// likeliest moment: the spill and the journal grow only then); space
// comes back, then the fabric. Every event is stored once, in order. The
// spill's first failed write made its writer fail for good: nothing
// spilled was ever read back. The disk is made full for the process with
// RLIMIT_FSIZE (a write past it fails with EFBIG, SIGXFSZ ignored): the
// test is not parallel, and lifts it before the fabric comes back (its
// server is in this process).
func TestSpillGoesOnAfterTheDiskWasFull(t *testing.T) {
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	d := &downJS{JetStream: js}
	d.down.Store(true)
	sp, err := openSpill(filepath.Join(t.TempDir(), "outbox.spill"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	p := newPublisher(asyncSender{d}, testStore(t, nc, js).lastEvents, 16, outboxLimits{Memory: 8 << 10, Disk: 64 << 20}, sp, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	payload := strings.Repeat("x", 1000)
	n := uint64(0)
	push := func(k int) {
		for range k {
			n++
			p.enqueue(newOutMsg(schemas.EventSubject("o"), "n", "o", n, []byte(fmt.Sprintf(`{"n":%d,"p":%q}`, n, payload)), time.Now()))
		}
	}

	// The disk is full: no file grows past 64 KiB.
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 64 << 10, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	room := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}
	defer room()
	push(400) // about 400 KB: past memory, onto the disk, whose writes fail
	p.mu.Lock()
	t.Logf("while the disk is full: %d in memory, %d spilled, %d in the tail", len(p.queue), sp.count, len(p.tail))
	p.mu.Unlock()
	room()
	push(10)
	d.down.Store(false) // the fabric is back
	fctx, fcancel := context.WithTimeout(ctx, 20*time.Second)
	defer fcancel()
	if err := p.flush(fctx); err != nil {
		t.Fatalf("the outbox does not drain once the fabric is back: %v (%d of %d waiting)", err, p.pending(), n)
	}
	room()
	s, _ := js.Stream(ctx, schemas.StreamName)
	cons, _ := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"agent.o"}})
	for want := uint64(1); want <= n; want++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("event %d missing: %v", want, err)
		}
		if _, got, _ := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID)); got != want {
			t.Fatalf("event %d where %d belongs", got, want)
		}
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != n {
		t.Fatalf("the stream holds %v events (%v), want %d", info.State.Msgs, err, n)
	}
}

// While the spill cannot write, what it gathered in memory is read back
// after what the file holds, in order, and it writes again once there is
// room.
func TestSpillReadsWhatItCouldNotWrite(t *testing.T) {
	sp, err := openSpill(filepath.Join(t.TempDir(), "outbox.spill"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	payload := strings.Repeat("x", 1000)
	n, popped := uint64(0), uint64(0)
	push := func(k int) (refused int) {
		for range k {
			m := newOutMsg(schemas.EventSubject("o"), "n", "o", n+1, []byte(fmt.Sprintf(`{"n":%d,"p":%q}`, n+1, payload)), time.Now())
			if sp.push(m) != nil {
				refused++
				continue
			}
			n++
		}
		return refused
	}
	pop := func(most int) {
		t.Helper()
		ms, err := sp.pop(most, 1<<30)
		if err != nil {
			t.Fatalf("pop: %v", err)
		}
		for _, m := range ms {
			if popped++; m.seq != popped || !strings.Contains(string(m.data), fmt.Sprintf(`{"n":%d,`, popped)) {
				t.Fatalf("read back event %d where %d belongs", m.seq, popped)
			}
		}
	}
	push(100) // in the file
	if err := sp.write(); err != nil {
		t.Fatal(err)
	}
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 150 << 10, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	room := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}
	defer room()
	if refused := push(400); refused == 0 {
		t.Fatalf("400 events of 1 KB pushed past a full disk: none refused; the spill gathers without bound")
	}
	pop(150) // the file's, then from memory
	pop(30)
	if err := sp.write(); err == nil {
		t.Fatalf("a write past the disk's room succeeded")
	}
	pop(20)
	room()
	push(50)
	for sp.count > 0 {
		pop(64)
	}
	if popped != n {
		t.Fatalf("read back %d of %d events", popped, n)
	}
}
