package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// An event the host dropped (its agent was taken for lost while the node
// was away) was never stored: the stream holds the coordinator's
// cancelled result in its place. A run waiting for its turn's end to be
// stored was told it was, and answered with the turn's text as if the
// stream had it; it is told it was not.
func TestPublisherTellsWhoWaitsThatADroppedEventWasNotStored(t *testing.T) {
	p, answers, out, stop := recordedPublisher(t, false)
	defer stop()
	p.mu.Lock()
	p.onLapse = func() {}
	p.mu.Unlock()
	now := time.Now()
	p.extend(now.Add(time.Hour))
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 1, []byte(`{}`), time.Now()))
	select {
	case <-out.sent:
		answers <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("a:1 was not sent")
	}
	if err := p.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The lease ran out; the turn's end (a:2, a:3) waits.
	p.mu.Lock()
	p.lease = now.Add(-time.Minute)
	p.mu.Unlock()
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 2, []byte(`{}`), time.Now()))
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 3, []byte(`{}`), time.Now()))
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		waited <- p.waitStored(ctx, "a", 3)
	}()
	for registered := false; !registered; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		registered = len(p.waiters["a"]) > 0
		p.mu.Unlock()
	}
	// The host found a taken for lost.
	p.drop("a", 3)
	p.resume(time.Now().Add(time.Hour))
	select {
	case m := <-out.sent:
		t.Fatalf("sent %s of an agent taken for lost", m.Header.Get(schemas.HeaderMsgID))
	case err := <-waited:
		if !errors.Is(err, errTakenForLost) {
			t.Errorf("waiting for a:3, dropped unsent (the stream has the coordinator's close instead): %v, want it said", err)
		}
	}
}

// A beat that began within the lease but was acknowledged only after the
// lease ran out (the network held it: it was stored after the node's
// entry may have expired and the coordinator closed its agents) is no
// proof the entry lived throughout: it renews nothing, and the host is
// told of the lapse. The publisher took the lease from when such a beat
// began, so a node whose held beats were delivered after its entry
// expired never lapsed, and sent on after the coordinator's close.
func TestPublisherBeatAcknowledgedPastItsLeaseRenewsNothing(t *testing.T) {
	p, answers, out, stop := recordedPublisher(t, false)
	defer stop()
	lapses := lapsesOf(p)
	now := time.Now()
	p.extend(now.Add(time.Hour))
	// The lease (from a beat long ago) ran out a second ago, nothing was
	// sent since (the publisher waited on acknowledgements the network
	// held); a beat that began two seconds ago, within it, is acknowledged now.
	p.mu.Lock()
	p.lease = now.Add(-time.Second)
	p.mu.Unlock()
	began := now.Add(-2 * time.Second)
	p.extend(began.Add(time.Hour))
	p.enqueue(newOutMsg(schemas.EventSubject("a"), "n", "a", 1, []byte(`{}`), time.Now()))
	select {
	case m := <-out.sent:
		answers <- nil
		t.Errorf("sent %s on a lease renewed by a beat acknowledged after the lease ran out", m.Header.Get(schemas.HeaderMsgID))
	case <-lapses:
	case <-time.After(5 * time.Second):
		t.Fatal("neither sent nor lapsed")
	}
}

// lapsesOf tells of each lapse the publisher reports to its host.
func lapsesOf(p *publisher) <-chan struct{} {
	lapses := make(chan struct{}, 4)
	p.mu.Lock()
	p.onLapse = func() { lapses <- struct{}{} }
	p.mu.Unlock()
	return lapses
}
