package client

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
