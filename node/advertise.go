package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// checkNameFree refuses to start a second node under a name a running
// node answers to.
func (h *Host) checkNameFree(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := h.cfg.Conn.RequestWithContext(ctx, schemas.ControlSubject(h.cfg.Name, schemas.VerbList), []byte(`{}`))
	switch {
	case err == nil:
		return fmt.Errorf("a node named %s is already running; give this node another name", h.cfg.Name)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
		return nil
	}
	return fmt.Errorf("check that the name %s is free: %w", h.cfg.Name, err)
}

// advertiser keeps the node's record in NodesBucket: written at start, on
// every heartbeat, and at once when the number of live agents changes.
// What the node can run is detected again every refresh.
type advertiser struct {
	h        *Host
	kv       jetstream.KeyValue
	rec      schemas.NodeRecord
	interval time.Duration
	changed  chan struct{}
}

func newAdvertiser(ctx context.Context, h *Host, kv jetstream.KeyValue) (*advertiser, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read KV bucket %s: %w", schemas.NodesBucket, err)
	}
	interval := st.TTL() / 3
	if interval <= 0 || interval > 5*time.Second {
		interval = 5 * time.Second
	}
	var id [8]byte
	rand.Read(id[:])
	a := &advertiser{h: h, kv: kv, interval: interval, changed: make(chan struct{}, 1)}
	a.rec = schemas.NodeRecord{
		Name:      h.cfg.Name,
		Version:   h.cfg.Version,
		Instance:  hex.EncodeToString(id[:]),
		Labels:    h.cfg.Labels,
		Host:      hostInfo(),
		MaxAgents: h.cfg.MaxAgents,
		StartedAt: unixSeconds(time.Now()),
	}
	if a.rec.Labels == nil {
		a.rec.Labels = map[string]string{}
	}
	a.detect(ctx)
	return a, a.write(ctx)
}

// detect refreshes what the node can run: its backends' own descriptions
// and whatever else the node's configuration detects.
func (a *advertiser) detect(ctx context.Context) {
	var infos []schemas.BackendInfo
	for _, b := range a.h.cfg.Backends {
		if d, ok := b.(backend.Describer); ok {
			infos = append(infos, d.Describe(ctx))
		} else {
			infos = append(infos, schemas.BackendInfo{Kind: b.Kind(), Ready: true})
		}
	}
	if a.h.cfg.Detect != nil {
		for _, d := range a.h.cfg.Detect(ctx) {
			if !slices.ContainsFunc(infos, func(i schemas.BackendInfo) bool { return i.Kind == d.Kind && i.Agent == d.Agent }) {
				infos = append(infos, d)
			}
		}
	}
	if infos == nil {
		infos = []schemas.BackendInfo{}
	}
	a.rec.Backends = infos
}

func (a *advertiser) write(ctx context.Context) error {
	a.rec.Agents = a.h.liveAgents()
	a.rec.Heartbeat = unixSeconds(time.Now())
	b, _ := json.Marshal(a.rec)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := a.kv.Put(wctx, a.h.cfg.Name, b)
	return err
}

// poke asks for a write soon, after the number of agents changed.
func (a *advertiser) poke() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *advertiser) run(ctx context.Context) {
	beat := time.NewTicker(a.interval)
	defer beat.Stop()
	refresh := time.NewTicker(a.h.cfg.RefreshInterval)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			a.detect(ctx)
		case <-beat.C:
		case <-a.changed:
		}
		if err := a.write(ctx); err != nil {
			a.h.log.Warn("heartbeat failed", "err", err)
		}
	}
}

// leave removes the node's record on a clean stop.
func (a *advertiser) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a.kv.Delete(ctx, a.h.cfg.Name)
}

// liveAgents counts the agents that are not dead.
func (h *Host) liveAgents() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range h.agents {
		if !a.isDead() {
			n++
		}
	}
	return n
}
