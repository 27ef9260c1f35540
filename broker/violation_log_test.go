package broker_test

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// logBuffer is a log's text that the test reads while the server writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Any credential, an observer's among them, made the server log a line
// for each publish it may not make: 100,000 publishes in under a second
// wrote 29 MB to the coordinator's log, burying what else it said
// (outside review). A connection's violations have a bounded share of
// lines within a window, the rest counted; another connection's are
// logged all the same.
func TestPermissionViolationsAreLoggedBounded(t *testing.T) {
	t.Parallel()
	auth, err := broker.OpenAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	b := natstest.Start(t, func(c *broker.Config) {
		c.Auth = auth
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	// Connected as an observer, heedless of what the server says back.
	connect := func(name string) *nats.Conn {
		return natstest.Connect(t, b, nats.UserCredentials(issue(t, auth, broker.RoleObserver, name)), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	}
	flood := connect("flood")
	for range 5000 {
		if err := flood.Publish(schemas.EventSubject("victim"), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := flood.Flush(); err != nil {
		t.Fatal(err)
	}
	other := connect("other")
	other.Publish(schemas.EventSubject("other-victim"), []byte("x"))
	other.Flush()
	poll.Until(t, 30*time.Second, "the other connection's violation to be logged", func() bool {
		return strings.Contains(logs.String(), `other-victim`)
	})
	if n := strings.Count(logs.String(), `Publish Violation - Subject \"agent.victim\"`); n > 25 {
		t.Errorf("the server logged %d lines of one connection's 5000 violations; want a bounded few", n)
	}
	if !strings.Contains(logs.String(), "more permission violations of this connection are not logged") {
		t.Errorf("the log does not say the flooding connection's violations were held back:\n%.3000s", logs.String())
	}
}
