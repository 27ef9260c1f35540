package client

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KeyWatch is a jetstream.KeyWatcher that outlives the server's restarts.
//
// A watch of nats.go (v1.55.0, jetstream.KeyValue.Watch) is an ordered
// push consumer that lives in the server's memory. When the server goes
// and comes back, the client connects again and subscribes again, but the
// consumer is gone; the watch learns it only when its heartbeat check
// finds no heartbeat in two periods of 5s (js.go, activityCheck), and
// then makes the consumer again from where it stopped
// (resetOrderedConsumer). Until then, 10 to 20 seconds, it delivers
// nothing, and what expired meanwhile (a node's heartbeat entry, the
// marker left when it expired) it never delivers. A consumer it cannot
// make again for good ends the watch: its channel closes.
//
// A KeyWatch makes the watch again as soon as the connection is back,
// and whenever the watch ends while the connection is open, from the
// revision after the last one it passed on, so its caller sees every
// change still stored, once and in order, without a gap of its own.
// Like nats.go's, it sends nil once, when the entries there at its start
// are in (unless jetstream.UpdatesOnly is among its options), and its
// channel closes when its context ends, when it is stopped, or when its
// connection is closed for good.
type KeyWatch struct {
	out  chan jetstream.KeyValueEntry
	recn chan time.Time // Reconnected
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// keyWatchRetry bounds the wait between attempts to make a watch again
// while the server does not take them (JetStream still starting, say).
const keyWatchRetry = 2 * time.Second

// WatchKeys watches keys of kv (a key or a pattern; jetstream.AllKeys for
// every key) over nc, the connection kv was made on, until ctx ends.
// Its first watch is made before it returns, and its error returned.
func WatchKeys(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, keys string, opts ...jetstream.WatchOpt) (*KeyWatch, error) {
	// Listened for before the first watch is made, so a reconnection
	// while it is made is not missed.
	back := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	w, err := kv.Watch(ctx, keys, opts...)
	if err != nil {
		nc.RemoveStatusListener(back)
		return nil, err
	}
	x := &KeyWatch{out: make(chan jetstream.KeyValueEntry), recn: make(chan time.Time, 1), stop: make(chan struct{}), done: make(chan struct{})}
	f := keyFollower{KeyWatch: x, nc: nc, back: back, watch: func(rev uint64) (jetstream.KeyWatcher, error) {
		if rev == 0 {
			return kv.Watch(ctx, keys, opts...)
		}
		return kv.Watch(ctx, keys, append(opts[:len(opts):len(opts)], jetstream.ResumeFromRevision(rev+1))...)
	}}
	go f.run(ctx, w)
	return x, nil
}

// WatchAllKeys is WatchKeys for every key of kv.
func WatchAllKeys(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, opts ...jetstream.WatchOpt) (*KeyWatch, error) {
	return WatchKeys(ctx, nc, kv, jetstream.AllKeys, opts...)
}

// Updates returns the channel of entries.
func (x *KeyWatch) Updates() <-chan jetstream.KeyValueEntry { return x.out }

// Reconnected returns a channel that receives when the connection came
// back (perhaps to a restarted server, which may have expired entries
// while it was away) the time it was found lost: an entry made after
// that time was made after the outage began. It receives before any
// entry of the watch made again is sent on Updates; of several
// reconnections not yet received, the last one's time is kept.
//
// The time is taken when nats.go reports the loss (its status listener
// is told as the connection goes): it is the loss's time, not the time
// the reconnection is received, so an entry made the moment the
// connection is back counts as made after the outage, however late the
// receiver reads this channel.
func (x *KeyWatch) Reconnected() <-chan time.Time { return x.recn }

// Stop ends the watch, and returns once its channel is closed.
func (x *KeyWatch) Stop() error {
	x.once.Do(func() { close(x.stop) })
	<-x.done
	return nil
}

type keyFollower struct {
	*KeyWatch
	nc    *nats.Conn
	back  chan nats.Status
	watch func(rev uint64) (jetstream.KeyWatcher, error)
}

func (f keyFollower) run(ctx context.Context, w jetstream.KeyWatcher) {
	defer close(f.done)
	defer close(f.out)
	defer f.nc.RemoveStatusListener(f.back)
	defer func() { endKeyWatch(w) }()
	var (
		rev    uint64    // the last revision passed on
		synced bool      // the nil marker passed on
		lost   time.Time // when the connection went, since it was last back
		retry  <-chan time.Time
		pause  = 50 * time.Millisecond
	)
	again := func() {
		switch {
		case f.nc.IsClosed():
			retry = time.After(0) // to end
			return
		case !f.nc.IsConnected():
			retry = nil // f.back says when it is back
			return
		}
		var err error
		if w, err = f.watch(rev); err != nil {
			w = nil
			retry = time.After(pause)
			pause = min(2*pause, keyWatchRetry)
			return
		}
		retry, pause = nil, 50*time.Millisecond
	}
	for {
		var updates <-chan jetstream.KeyValueEntry
		if w != nil {
			updates = w.Updates()
		}
		select {
		case <-ctx.Done():
			return
		case <-f.stop:
			return
		case s := <-f.back:
			switch s {
			case nats.CLOSED:
				return
			case nats.DISCONNECTED, nats.RECONNECTING:
				if lost.IsZero() {
					lost = time.Now()
				}
				continue
			}
			// Connected again, perhaps to a server that does not have
			// the watch's consumer (a restarted one): make it again now
			// rather than when nats.go misses its heartbeats.
			if lost.IsZero() {
				lost = time.Now() // its loss not heard (nats.go drops events to a full listener)
			}
			select {
			case <-f.recn: // an earlier one not yet received gives way
			default:
			}
			f.recn <- lost
			lost = time.Time{}
			endKeyWatch(w)
			again()
		case <-retry:
			if f.nc.IsClosed() {
				return
			}
			again()
		case e, ok := <-updates:
			if !ok {
				// The watch ended with its connection open (its consumer
				// could not be made again) or closed (for good: nothing
				// more can come).
				w = nil
				if f.nc.IsClosed() || ctx.Err() != nil {
					return
				}
				retry = time.After(0)
				continue
			}
			if e == nil {
				if synced {
					continue
				}
				synced = true
			} else {
				if e.Revision() <= rev {
					continue // passed on before the watch was made again
				}
				rev = e.Revision()
			}
			select {
			case f.out <- e:
			case <-ctx.Done():
				return
			case <-f.stop:
				return
			}
		}
	}
}

// endKeyWatch stops w and waits for its channel to close; nats.go's watcher
// blocks sending to a full channel, so what is left in it is read and
// dropped (the next watch starts after the last entry passed on).
func endKeyWatch(w jetstream.KeyWatcher) {
	if w == nil {
		return
	}
	w.Stop()
	for range w.Updates() {
	}
}

// eachValue calls fn with the value of each key of kv, as it is now, read
// in one pass (ReadBucket).
func eachValue(ctx context.Context, kv jetstream.KeyValue, fn func(key string, value []byte)) error {
	return ReadBucket(ctx, kv, func(e jetstream.KeyValueEntry) { fn(e.Key(), e.Value()) })
}

// ReadBucket calls fn with each key's entry of kv, as it is now, read in
// one pass (a watch that ends once it has passed on what is stored), not
// with a request per key: a list of a thousand records is one consumer's
// deliveries, not a thousand round trips. Entries come in the order they
// were written.
//
// The watch's own word that it has passed on what is stored comes early
// when a key is rewritten as it reads (nats.go v1.55.0 takes the
// consumer's count of what is left, which in its first, last-per-key
// phase does not count the rewrite): the key's old entry, gone, is not
// delivered, and its new one comes after the word. So the read goes on
// past it until it has seen the bucket's last entry as it stood then:
// everything written before that, the rewrites among it, is passed on.
func ReadBucket(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx) // deletes too: their revisions count toward the last
	if err != nil {
		return err
	}
	defer endKeyWatch(w) // drained: a read left mid-way blocks no goroutine of nats.go's
	latest := map[string]jetstream.KeyValueEntry{}
	var (
		seen   uint64           // the highest revision passed on
		last   uint64           // the bucket's last revision when the watch said it was done
		held   uint64           // the same, kept when an idle wait gives up on it
		synced bool             // the watch said so
		idle   <-chan time.Time // past its word, a bound on the wait for last
	)
	for !synced || seen < last {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-idle:
			// The last entry went (it expired) before it was delivered:
			// what was read is all there is.
			synced, last = true, 0
		case e, ok := <-w.Updates():
			switch {
			case !ok && ctx.Err() != nil:
				return ctx.Err()
			case !ok:
				return fmt.Errorf("the read of %s ended before it had read every key", kv.Bucket())
			case e == nil:
				synced = true
				if last, err = lastRevision(ctx, kv); err != nil {
					return fmt.Errorf("read %s: %w", kv.Bucket(), err)
				}
				held = last
				idle = time.After(readBucketIdle)
				continue
			}
			seen = max(seen, e.Revision())
			if e.Operation() == jetstream.KeyValuePut {
				latest[e.Key()] = e
			} else {
				delete(latest, e.Key())
			}
		}
	}
	if seen == 0 {
		// A bucket holding entries whose read gave none failed (its
		// store could not read them: the coordinator out of file
		// descriptors once), and an empty list would say there are none.
		// Not one whose entries were written since the watch was done
		// (its last revision then is behind the bucket's now).
		if st, err := kv.Status(ctx); err != nil {
			return fmt.Errorf("read %s: %w", kv.Bucket(), err)
		} else if now, _ := lastRevision(ctx, kv); st.Values() > 0 && now <= held {
			return fmt.Errorf("the read of %s gave none of the %d entries it holds", kv.Bucket(), st.Values())
		}
	}
	entries := slices.Collect(maps.Values(latest))
	slices.SortFunc(entries, func(a, b jetstream.KeyValueEntry) int { return cmp.Compare(a.Revision(), b.Revision()) })
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		fn(e)
	}
	return nil
}

// readBucketIdle bounds ReadBucket's wait, past the watch's word, for
// the bucket's last entry.
const readBucketIdle = 5 * time.Second

// lastRevision is the revision of the last entry kv holds, 0 when it
// holds none.
func lastRevision(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	b, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || b.StreamInfo() == nil || b.StreamInfo().State.Msgs == 0 {
		return 0, nil
	}
	return b.StreamInfo().State.LastSeq, nil
}
