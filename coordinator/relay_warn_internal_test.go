package coordinator

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// warnBuf is a log written from many goroutines.
type warnBuf struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *warnBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}
func (b *warnBuf) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.sb.String() }

// A line the relay held back (a node past its share of the log) is
// logged once the window is over, not taken for said: an outside reader
// found a node's other kinds of warning never logged again after one
// flooded minute.
func TestRelayLogsAHeldBackLineOnceTheWindowIsOver(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	var logs warnBuf
	r, err := NewRelay(RelayConfig{Conn: nc, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range warnsPerWindow {
		r.warn("evil/made-up-"+string(rune('a'+i)), "refused a node's write", "node", "evil")
	}
	r.warn("evil/unsure", "could not decide a node's event; answered 503, to be sent again", "node", "evil")
	// The minute passes.
	r.mu.Lock()
	r.warnings["evil"].start = time.Now().Add(-2 * warnWindow)
	r.mu.Unlock()
	r.warn("evil/unsure", "could not decide a node's event; answered 503, to be sent again", "node", "evil")
	if !strings.Contains(logs.String(), "could not decide a node's event") {
		t.Errorf("node evil's first 'could not decide' line, held back within a flooded minute, is not logged after it either:\n%s", logs.String())
	}
}
