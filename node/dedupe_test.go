package node

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A retry that arrives while the first request still runs (or after)
// gets the first reply; the operation runs once. Another key runs on its
// own, a key past the window runs again, and so does one whose reply was
// not kept (a failure that may pass).
func TestDedupeRetryWhileRunning(t *testing.T) {
	d := newDedupe(time.Hour)
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	slow := func() (answer, bool) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return answer{body: []byte("first")}, true
	}
	var wg sync.WaitGroup
	replies := make([]string, 4)
	wg.Go(func() { replies[0] = text(d.do("send/a/r1", func() {}, slow)) })
	<-started
	for i := 1; i < len(replies); i++ {
		wg.Go(func() {
			replies[i] = text(d.do("send/a/r1", func() {}, func() (answer, bool) { runs.Add(1); return answer{body: []byte("again")}, true }))
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
	if got := text(d.do("send/b/r1", func() {}, func() (answer, bool) { return answer{body: []byte("other")}, true })); got != "other" {
		t.Errorf("another key got %q", got)
	}

	if got := text(d.do("open/x/r2", func() {}, func() (answer, bool) { return answer{body: []byte("unavailable")}, false })); got != "unavailable" {
		t.Errorf("a failure that may pass answered %q", got)
	}
	if got := text(d.do("open/x/r2", func() {}, func() (answer, bool) { return answer{body: []byte("opened")}, true })); got != "opened" {
		t.Errorf("the retry of a failure that may pass got %q, want a fresh run", got)
	}

	short := newDedupe(time.Nanosecond)
	short.do("k", func() {}, func() (answer, bool) { return answer{body: []byte("one")}, true })
	time.Sleep(time.Millisecond) // past a one-nanosecond window
	if got := text(short.do("k", func() {}, func() (answer, bool) { return answer{body: []byte("two")}, true })); got != "two" {
		t.Errorf("a request past the window got %q, want a fresh run", got)
	}
}

func text(a answer) string { return string(a.body) }
