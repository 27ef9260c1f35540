package client

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// nodeCache follows NodesBucket, so placement reads every node without a
// round trip per node.
type nodeCache struct {
	mu     sync.RWMutex
	nodes  map[string]schemas.NodeRecord
	synced chan struct{}
	// watchers are told, once, what became of a node that goes or
	// restarts (watchNode).
	watchers map[string][]chan string
}

// watch reports, once, what becomes of node if it goes or restarts; stop
// ends the watch.
func (c *nodeCache) watch(node string) (lost <-chan string, stop func()) {
	ch := make(chan string, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.nodes[node]; !ok {
		ch <- "is not running"
		return ch, func() {}
	}
	if c.watchers == nil {
		c.watchers = map[string][]chan string{}
	}
	c.watchers[node] = append(c.watchers[node], ch)
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.watchers[node] = slices.DeleteFunc(c.watchers[node], func(w chan string) bool { return w == ch })
	}
}

// WatchNodes keeps the fabric's view of its nodes current until ctx ends;
// without it, each Nodes call reads the bucket afresh.
func (f *Direct) WatchNodes(ctx context.Context) error {
	kv, err := f.nodesKV(ctx)
	if err != nil {
		return err
	}
	w, err := WatchAllKeys(ctx, f.nc, kv)
	if err != nil {
		return err
	}
	c := &nodeCache{nodes: map[string]schemas.NodeRecord{}, synced: make(chan struct{})}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e == nil {
				close(c.synced)
				continue
			}
			c.apply(e)
		}
	}()
	select {
	case <-c.synced:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	f.cache = c
	f.mu.Unlock()
	return nil
}

func (c *nodeCache) apply(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tell := func(why string) {
		for _, w := range c.watchers[e.Key()] {
			w <- why
		}
		delete(c.watchers, e.Key())
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.nodes, e.Key())
		tell("was lost or stopped")
		return
	}
	var rec schemas.NodeRecord
	if json.Unmarshal(e.Value(), &rec) == nil {
		if old, ok := c.nodes[e.Key()]; ok && old.Instance != rec.Instance {
			tell("restarted")
		}
		c.nodes[e.Key()] = rec
	}
}

func (c *nodeCache) list() []schemas.NodeRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]schemas.NodeRecord, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n)
	}
	return out
}

// Nodes lists the nodes whose heartbeat is current, by name.
func (f *Direct) Nodes(ctx context.Context) ([]schemas.NodeRecord, error) {
	f.mu.Lock()
	c := f.cache
	f.mu.Unlock()
	var nodes []schemas.NodeRecord
	if c != nil {
		nodes = c.list()
	} else {
		kv, err := f.nodesKV(ctx)
		if err != nil {
			return nil, err
		}
		nodes = []schemas.NodeRecord{}
		if err := eachValue(ctx, kv, func(_ string, v []byte) {
			var rec schemas.NodeRecord
			if json.Unmarshal(v, &rec) == nil {
				nodes = append(nodes, rec)
			}
		}); err != nil {
			return nil, err
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes, nil
}
