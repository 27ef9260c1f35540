package service

import (
	"context"
	"sync"
)

type waitNoticeKey struct{}

// WithWaitNotice returns a context in which an operation calls notice,
// once, just before it starts what may take long: a request to a node (an
// agent to start, a turn to end, a node that hangs), a read of an agent's
// events or of every record. Checking a request and reading one record
// come before.
//
// A NATS micro handler uses it to hold a request only while the answer
// comes at once. micro counts an error reply in `nats micro stats` only
// when the handler sends it before returning, and an endpoint hands its
// handler one request at a time; so the handler answers on its own
// goroutine what fails before any wait (a bad request, an unknown agent,
// a dead one, a failed placement), and lets the request go on notice, to
// be answered later without holding up the next one.
func WithWaitNotice(ctx context.Context, notice func()) context.Context {
	var once sync.Once
	return context.WithValue(ctx, waitNoticeKey{}, func() { once.Do(notice) })
}

// LongWait tells ctx's wait notice, if it has one, that the operation
// starts a long wait.
func LongWait(ctx context.Context) {
	if notice, ok := ctx.Value(waitNoticeKey{}).(func()); ok {
		notice()
	}
}

// hold runs work on a goroutine of spawn's and calls answer with its
// result: with held true while the caller still waits here, which is as
// long as work gives no wait notice; with held false once hold has
// returned on the notice and work answers later on its own. A micro
// handler so answers at once what fails at once, and lets a long request
// go.
func hold[A any](spawn func(func()), work func(notice func()) A, answer func(a A, held bool)) {
	done := make(chan A, 1)
	waiting := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	held := true
	spawn(func() {
		a := work(func() { once.Do(func() { close(waiting) }) })
		mu.Lock()
		if held {
			done <- a
			mu.Unlock()
			return
		}
		mu.Unlock()
		answer(a, false)
	})
	select {
	case a := <-done:
		answer(a, true)
	case <-waiting:
		mu.Lock()
		defer mu.Unlock()
		select {
		case a := <-done:
			answer(a, true)
		default:
			held = false
		}
	}
}
