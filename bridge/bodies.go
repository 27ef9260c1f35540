package bridge

import (
	"context"
	"fmt"
	"sync"
)

// What a request's body costs the endpoint is many times its bytes while
// it is decoded (the MCP library's decode of the whole message, the
// arguments' validation), whatever the call turns out to be: a 14 MB body
// of junk arguments took 170 MiB of heap before it was refused. So the
// bodies the endpoint holds at once are bounded, per principal and in
// all, and a request past the bound is refused at once (503, Retry-After)
// before its body is read, as an initialize past the sessions' bound is.
const (
	// bodiesPerCaller bounds the bytes of the bodies one principal has
	// in flight: one of the largest, with room beside it for small calls.
	bodiesPerCaller = maxMCPBody + maxMCPBody/2
	// bodiesInAll bounds the bytes of every principal's together (each
	// agent is a principal of its own).
	bodiesInAll = 6 * maxMCPBody
)

// bodiesOfLesser bounds the bytes of the bodies the principals that are
// not people (the observer's token, agents) hold together: one caller's
// share of the whole is kept for the people's (the full token's, or
// everyone's where no token is set), which the observer's token and three
// agents' took whole, each trickling two large bodies.
const bodiesOfLesser = bodiesInAll - bodiesPerCaller

// bodies counts the bytes of the request bodies held, by principal.
type bodies struct {
	mu     sync.Mutex
	by     map[string]int64
	total  int64
	lesser int64 // of principals that are not people
}

// person reports whether principal who is the people's.
func person(who string) bool { return who == "full" || who == "everyone" }

func newBodies() *bodies { return &bodies{by: map[string]int64{}} }

// take holds n bytes for principal who, or says why it may not now.
func (b *bodies) take(who string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.by[who]+n > bodiesPerCaller:
		return fmt.Errorf("these credentials have %d bytes of requests being read already; a request of %d more would pass the %d one caller may have at once: send it when those are answered", b.by[who], n, int64(bodiesPerCaller))
	case b.total+n > bodiesInAll:
		return fmt.Errorf("the endpoint is reading %d bytes of requests already, the most it holds at once: send it again in a moment", b.total)
	case !person(who) && b.lesser+n > bodiesOfLesser:
		return fmt.Errorf("the endpoint is reading %d bytes of requests of agents and observers already, the most it holds of theirs (the rest is kept for the full token): send it again in a moment", b.lesser)
	}
	b.by[who] += n
	b.total += n
	if !person(who) {
		b.lesser += n
	}
	return nil
}

// give returns n of principal who's bytes.
func (b *bodies) give(who string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if !person(who) {
		b.lesser -= n
	}
	if b.by[who] -= n; b.by[who] <= 0 {
		delete(b.by, who)
	}
}

// bodyReadKey is the context key of the function that gives a request's
// body's bytes back to the caller's bound.
type bodyReadKey struct{}

// bodyRead gives the bytes of the body of the request ctx belongs to back
// to its caller's bound: its call's arguments are decoded and checked,
// so what remains of the body is the call's own work, bounded elsewhere.
func bodyRead(ctx context.Context) {
	if done, ok := ctx.Value(bodyReadKey{}).(func()); ok {
		done()
	}
}
