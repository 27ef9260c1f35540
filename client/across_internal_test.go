package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A request whose holder said it held it and then went silent for good
// (a coordinator stopped while the caller's server stayed up) is sent
// again after each silence, saying so, and ends with errHolderLost once no one took it
// up within sentAgainFor of the last word: not at the caller's deadline.
// Not parallel: it shortens sentAgainFor.
func TestARequestWhoseHolderWentSilentEnds(t *testing.T) {
	defer func(was time.Duration) { sentAgainFor = was }(sentAgainFor)
	sentAgainFor = 3 * time.Second
	srv := natstest.Start(t)
	holder := natstest.Connect(t, srv)
	var asked atomic.Int32
	if _, err := holder.Subscribe("silent.holder", func(m *nats.Msg) {
		if asked.Add(1) > 1 {
			return // the copy reaches a holder that says nothing
		}
		go func() {
			for range 3 {
				holder.PublishMsg(&nats.Msg{Subject: m.Reply, Header: nats.Header{schemas.HeaderKeepalive: {"1"}}})
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}); err != nil {
		t.Fatal(err)
	}
	holder.Flush()
	caller := natstest.Connect(t, srv)
	var mu sync.Mutex
	var said []string
	tell := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		said = append(said, line)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := requestAcross(ctx, caller, "silent.holder", caller.NewInbox(), []byte("{}"), nil, 100*time.Millisecond, tell)
	if !errors.Is(err, errHolderLost) {
		t.Fatalf("the wait on a holder gone silent ended with %v after %s, want errHolderLost", err, time.Since(began).Round(time.Millisecond))
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("the wait ended %s after it began, its holder silent after 0.3 s and sentAgainFor 3 s", took.Round(time.Millisecond))
	}
	if n := asked.Load(); n < 2 {
		t.Errorf("the request was sent %d times; want the first and copies after the silence", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(said) == 0 || !strings.Contains(said[0], "went silent") {
		t.Errorf("the caller was told %q; want a line that the holder went silent and the request went again", said)
	}
}

// A transfer that stalls says for how long, rather than printing its
// last line again (it read as a line printed twice).
func TestAStalledTransferSaysItIsStalled(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var said []string
	f := &Direct{progress: func(line string) {
		mu.Lock()
		defer mu.Unlock()
		said = append(said, line)
	}}
	r := &countingReader{}
	r.n.Store(43 << 20)
	done := f.report(r, 100<<20, "sending")
	time.Sleep(4500 * time.Millisecond)
	done()
	mu.Lock()
	defer mu.Unlock()
	if len(said) != 3 {
		t.Fatalf("in 4.5 s the report said %q; want its size and two reports", said)
	}
	if said[1] == said[2] {
		t.Errorf("a stalled transfer said the same line twice: %q", said[1])
	}
	if !strings.Contains(said[2], "nothing more for 2s") {
		t.Errorf("a stalled transfer's second report says %q; want how long nothing moved", said[2])
	}
}
