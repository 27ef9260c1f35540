package node

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// A retry that arrives while the first request still runs (or after)
// gets the first reply; the operation runs once. Another key runs on its
// own, a key past the window runs again, and so does one whose reply was
// not kept (a failure that may pass).
func TestDedupeRetryWhileRunning(t *testing.T) {
	body := []byte(`{"agent_id":"a","text":"hi","request_id":"r1"}`)
	d := newDedupe(time.Hour)
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	slow := func() (service.Reply, bool) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return service.Reply{Body: []byte("first")}, true
	}
	var wg sync.WaitGroup
	replies := make([]string, 4)
	wg.Go(func() { replies[0] = text(d.do("send/a/r1", body, func() {}, slow)) })
	<-started
	for i := 1; i < len(replies); i++ {
		wg.Go(func() {
			replies[i] = text(d.do("send/a/r1", body, func() {}, func() (service.Reply, bool) { runs.Add(1); return service.Reply{Body: []byte("again")}, true }))
		})
	}
	close(release)
	wg.Wait()
	for i, r := range replies {
		if r != "first" {
			t.Errorf("call %d got %q, want the first reply", i, r)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the operation ran %d times, want once", n)
	}
	if got := text(d.do("send/b/r1", body, func() {}, func() (service.Reply, bool) { return service.Reply{Body: []byte("other")}, true })); got != "other" {
		t.Errorf("another key got %q", got)
	}

	if got := text(d.do("open/x/r2", body, func() {}, func() (service.Reply, bool) { return service.Reply{Body: []byte("unavailable")}, false })); got != "unavailable" {
		t.Errorf("a failure that may pass answered %q", got)
	}
	if got := text(d.do("open/x/r2", body, func() {}, func() (service.Reply, bool) { return service.Reply{Body: []byte("opened")}, true })); got != "opened" {
		t.Errorf("the retry of a failure that may pass got %q, want a fresh run", got)
	}

	short := newDedupe(time.Nanosecond)
	short.do("k", body, func() {}, func() (service.Reply, bool) { return service.Reply{Body: []byte("one")}, true })
	time.Sleep(time.Millisecond) // past a one-nanosecond window
	if got := text(short.do("k", body, func() {}, func() (service.Reply, bool) { return service.Reply{Body: []byte("two")}, true })); got != "two" {
		t.Errorf("a request past the window got %q, want a fresh run", got)
	}
}

// A request id used again for a different request is no retry: it is
// refused as a conflict that names the first by its verb and agent (never
// by its content, which may be another principal's), and the operation
// does not run again.
func TestDedupeRefusesAnotherRequestUnderTheSameID(t *testing.T) {
	d := newDedupe(time.Hour)
	runs := 0
	op := func() (service.Reply, bool) { runs++; return service.Reply{Body: []byte(`{"turn":1}`)}, true }
	first := []byte(`{"agent_id":"a","request_id":"r1","text":"first text"}`)
	if got := text(d.do("send/a/r1", first, func() {}, op)); got != `{"turn":1}` {
		t.Fatalf("the first request got %q", got)
	}
	if got := text(d.do("send/a/r1", first, func() {}, op)); got != `{"turn":1}` {
		t.Fatalf("its retry got %q", got)
	}
	other := d.do("send/a/r1", []byte(`{"agent_id":"a","request_id":"r1","text":"another text"}`), func() {}, op)
	if other.Err == nil || other.Err.Code != schemas.CodeConflict ||
		!strings.Contains(other.Err.Message, "request id r1 was used") || !strings.Contains(other.Err.Message, "for another send request about agent a") ||
		strings.Contains(other.Err.Message, "first text") {
		t.Fatalf("a different request under the same id got %s (%+v)", other.Body, other.Err)
	}
	if runs != 1 {
		t.Errorf("the operation ran %d times, want once", runs)
	}
}

func text(a service.Reply) string { return string(a.Body) }
