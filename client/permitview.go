package client

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// permitView follows PermitsBucket and keeps the requests that wait for
// an answer, so a long-lived client lists them from memory: the bucket
// keeps each agent's latest answered requests too (up to
// schemas.MaxAnsweredPermits), which a read per call would take whole
// every time a monitor asks.
type permitView struct {
	mu      sync.Mutex
	waiting map[string]schemas.PermitRecord
	// answered holds the requests this client answered that the watch has
	// not yet shown answered, and since when: they are left out, so the
	// list read right after an answer does not offer it again. An entry
	// is dropped once the watch shows the answer, or after answeredFor.
	answered map[string]time.Time
}

// answeredFor bounds how long a request this client answered is left
// out of the list while the watch has not shown its answer: past it, the
// bucket's word is taken again (a node that took the answer but could not
// write it still waits).
const answeredFor = 10 * time.Second

// waitingRecord is the request an entry of the permits bucket holds, if
// it waits for an answer.
func waitingRecord(e jetstream.KeyValueEntry) (schemas.PermitRecord, bool) {
	var rec schemas.PermitRecord
	ok := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &rec) == nil && rec.Answer == nil
	return rec, ok
}

// apply updates the view with an entry of the watch: a request that
// waits is kept, anything else under its key dropped, and its leaving
// out ended.
func (v *permitView) apply(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rec, ok := waitingRecord(e); ok {
		v.waiting[e.Key()] = rec
		return
	}
	delete(v.waiting, e.Key())
	delete(v.answered, e.Key())
}

// replace makes the view what the bucket holds now, read afresh.
func (v *permitView) replace(ctx context.Context, kv jetstream.KeyValue) error {
	now := map[string]schemas.PermitRecord{}
	err := ReadBucket(ctx, kv, func(e jetstream.KeyValueEntry) {
		if rec, ok := waitingRecord(e); ok {
			now[e.Key()] = rec
		}
	})
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.waiting = now
	for key := range v.answered {
		if _, ok := now[key]; !ok {
			delete(v.answered, key) // nothing in the list would clear it
		}
	}
	return nil
}

// answer leaves key out of the list until the watch shows it answered.
// A key the view does not hold waiting is left alone: its answer came
// through the watch first, and a mark nothing would clear would stay.
func (v *permitView) answer(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.waiting[key]; ok {
		v.answered[key] = time.Now()
	}
}

// list is what waits, oldest first.
func (v *permitView) list() []schemas.PermitRecord {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]schemas.PermitRecord, 0, len(v.waiting))
	for key, rec := range v.waiting {
		if at, ok := v.answered[key]; ok {
			if time.Since(at) < answeredFor {
				continue
			}
			delete(v.answered, key)
		}
		out = append(out, rec)
	}
	sortPermits(out)
	return out
}

// WatchPermits keeps the requests waiting for an answer in memory until
// ctx ends, from a watch of the permits bucket; without it, each Pending
// call reads the bucket whole. It returns once what the bucket holds is
// in.
func (f *Direct) WatchPermits(ctx context.Context) error {
	kv, err := f.js.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "open KV bucket %s: %v", schemas.PermitsBucket, err)
	}
	w, err := WatchAllKeys(ctx, f.nc, kv)
	if err != nil {
		return err
	}
	v := &permitView{waiting: map[string]schemas.PermitRecord{}, answered: map[string]time.Time{}}
	synced := make(chan struct{})
	go func() {
		defer w.Stop()
		for {
			select {
			case <-w.Reconnected():
				// Perhaps to a server that lost what the watch had passed
				// on, where revisions start again below it: the watch
				// goes on from where it was, so what waits is read
				// afresh (kept as it was if it cannot be).
				v.replace(ctx, kv)
			case e, ok := <-w.Updates():
				switch {
				case !ok:
					return
				case e == nil:
					close(synced)
				default:
					v.apply(e)
				}
			}
		}
	}()
	select {
	case <-synced:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	f.permits = v
	f.mu.Unlock()
	return nil
}

// sortPermits orders requests by when they were asked, oldest first.
func sortPermits(reqs []schemas.PermitRecord) { slices.SortStableFunc(reqs, schemas.ByAsked) }
