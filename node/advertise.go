package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// advertiser keeps the node's record in NodesBucket: written at start, on
// every heartbeat, and at once when the number of live agents changes.
// What the node can run is detected again every refresh.
type advertiser struct {
	h        *Host
	mu       sync.Mutex
	rec      schemas.NodeRecord // under mu
	interval time.Duration
	ttl      time.Duration
	lease    time.Duration // how long after a beat begins its entry is sure to live; 0 for unknown
	changed  chan struct{}
	last     time.Time // when the last beat that was written began; under mu
	takenBy  string    // the life that took the node's name while it was away; under mu
}

// errNameTaken is what a node whose name another life took while it was
// away stops with.
var errNameTaken = errors.New("another node took this node's name while it was away")

// newAdvertiser detects what the node can run; it writes nothing yet. ttl
// is how long the node's entry lives without a beat.
func newAdvertiser(ctx context.Context, h *Host, ttl time.Duration) *advertiser {
	interval := ttl / 3
	if interval <= 0 || interval > 5*time.Second {
		interval = 5 * time.Second
	}
	instance := h.cfg.Instance
	if instance == "" {
		instance = schemas.NewInstance()
	}
	// The entry lives ttl from when the server stores it, which is after
	// the beat began; a tenth is left for an event in flight.
	a := &advertiser{h: h, interval: interval, ttl: ttl, lease: ttl - ttl/10, changed: make(chan struct{}, 1)}
	a.rec = schemas.NodeRecord{
		Name:      h.cfg.Name,
		Version:   h.cfg.Version,
		Instance:  instance,
		Labels:    h.cfg.Labels,
		Host:      hostInfo(),
		MaxAgents: h.cfg.MaxAgents,
		StartedAt: unixSeconds(time.Now()),
		Sandbox:   h.sandbox.kernel, SandboxProblem: h.sandbox.why + h.sandbox.nsWhy, SandboxMode: h.cfg.Sandbox, SandboxHolds: h.sandbox.kernel != "",
		Git: h.repos.git, Checkouts: h.repos.dir,
	}
	if a.rec.Labels == nil {
		a.rec.Labels = map[string]string{}
	}
	a.detect(ctx)
	return a
}

// record is the node's entry as it stands.
func (a *advertiser) record() schemas.NodeRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.rec
	rec.Agents = a.h.liveAgents()
	rec.Unhealthy = a.h.health()
	return rec
}

// detect refreshes what the node can run: its backends' own descriptions.
func (a *advertiser) detect(ctx context.Context) {
	var infos []schemas.BackendInfo
	for _, b := range a.h.cfg.Backends {
		if d, ok := b.(backend.ManyDescriber); ok {
			infos = append(infos, d.DescribeAll(ctx)...)
		} else if d, ok := b.(backend.Describer); ok {
			infos = append(infos, d.Describe(ctx))
		} else {
			infos = append(infos, schemas.BackendInfo{Kind: b.Kind(), Ready: true})
		}
	}
	if infos == nil {
		infos = []schemas.BackendInfo{}
	}
	// Every list of the nodes holds this record whole: what a model
	// server lists is advertised within a bound (schemas.MaxNodeRecordBytes).
	for i, b := range infos {
		var left int
		if infos[i], left = b.Within(); left > 0 {
			a.h.log.Warn("the model server lists more models than a node advertises: those past the bound are not", "backend", b.Kind, "host", b.Host, "models", len(b.Models), "not_advertised", left)
		}
	}
	a.mu.Lock()
	a.rec.Backends = infos
	a.mu.Unlock()
}

// readiness names the backends of infos that are ready ("claude",
// "acp:opencode") and says for each of the rest why it is not
// ("acp:gemini: <problem>").
func readiness(infos []schemas.BackendInfo) (ready, notReady []string) {
	for _, b := range infos {
		name := b.Kind
		if b.Agent != "" {
			name += ":" + b.Agent
		}
		switch {
		case b.Ready:
			ready = append(ready, name)
		case b.Problem != "":
			notReady = append(notReady, name+": "+b.Problem)
		default:
			notReady = append(notReady, name+": not ready")
		}
	}
	return ready, notReady
}

// write publishes the node's entry; it is called by the heartbeat and by
// opens and closes, concurrently.
//
// A beat more than a TTL after the last one written (the node was cut
// off, or stopped, past its TTL) first asks whose the name's entry is:
// another node may have started under the name meanwhile (refused only
// while this one answered). Beating over it would have the two take
// turns as the name; this node stops instead (takenOver).
func (a *advertiser) write(ctx context.Context) error {
	a.mu.Lock()
	if a.takenBy != "" {
		a.mu.Unlock()
		return errNameTaken
	}
	// The wall clock too: the monotonic one stands still while the
	// machine sleeps.
	now := time.Now()
	lapsed := !a.last.IsZero() && a.ttl > 0 && max(now.Sub(a.last), now.Round(0).Sub(a.last.Round(0))) > a.ttl
	a.mu.Unlock()
	if lapsed {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		hello, err := a.h.store.hello(hctx)
		cancel()
		if err != nil {
			return fmt.Errorf("ask whose the name's entry is after the heartbeat lapsed: %w", err)
		}
		if other := hello.Instance; other != "" && other != a.record().Instance {
			a.mu.Lock()
			a.takenBy = other
			a.mu.Unlock()
			a.h.takenOver(ctx, other)
			return errNameTaken
		}
	}
	a.mu.Lock()
	a.rec.Agents = a.h.liveAgents()
	a.rec.Unhealthy = a.h.health()
	a.rec.Heartbeat = unixSeconds(time.Now())
	b, _ := json.Marshal(a.rec)
	if len(b) > schemas.MaxNodeRecordBytes {
		// Past what the fabric takes (many backends, each at its bound):
		// advertised without their models rather than not at all, which
		// would have the node taken for lost.
		rec := a.rec
		rec.Backends = make([]schemas.BackendInfo, len(a.rec.Backends))
		for i, info := range a.rec.Backends {
			info.Models = nil
			rec.Backends[i] = info
		}
		b, _ = json.Marshal(rec)
		a.h.log.Error("the node's record is too large for the fabric with its backends' models; advertised without them", "bytes", len(b), "max", schemas.MaxNodeRecordBytes)
	}
	a.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	if err := a.h.store.beat(wctx, b); err != nil {
		return err
	}
	a.mu.Lock()
	if began.After(a.last) {
		a.last = began
	}
	a.mu.Unlock()
	if l := a.leaseFrom(began); !l.IsZero() {
		a.h.pub.extend(l)
	}
	return nil
}

// leaseFrom is the lease a beat that began at began gives the node's
// events; the zero time when the TTL is not known.
func (a *advertiser) leaseFrom(began time.Time) time.Time {
	if a.lease <= 0 {
		return time.Time{}
	}
	return began.Add(a.lease)
}

// poke asks for a write soon, after the number of agents changed.
func (a *advertiser) poke() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *advertiser) run(ctx context.Context) {
	// Detecting again runs CLIs and dials model servers, which can take
	// longer than an entry lives on a loaded machine: it has a loop of its
	// own, so no beat waits for it.
	var refreshing sync.WaitGroup
	defer refreshing.Wait()
	refreshing.Go(func() { a.refresh(ctx) })
	beat := time.NewTicker(a.interval)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
		case <-a.changed:
		}
		if err := a.write(ctx); errors.Is(err, errNameTaken) {
			return // the node stops
		} else if err != nil {
			a.h.log.Warn("heartbeat failed", "err", err)
		}
	}
}

// refresh detects what the node can run again, and sweeps ended agents'
// checkouts, every refresh interval; each refresh is written at once.
func (a *advertiser) refresh(ctx context.Context) {
	t := time.NewTicker(a.h.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.detect(ctx)
		a.h.repos.sweep(a.h.cfg.KeepFor, a.h.isLive)
		a.poke()
	}
}

// leave removes the node's record on a clean stop; not when another
// life holds the name, whose entry it is.
func (a *advertiser) leave(ctx context.Context) {
	a.mu.Lock()
	taken := a.takenBy != ""
	a.mu.Unlock()
	if taken {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a.h.store.leave(ctx)
}

// isLive reports whether agent id runs on this node.
func (h *Host) isLive(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.agents[id]
	return ok && !a.isDead()
}

// liveAgents counts the agents that are not dead.
func (h *Host) liveAgents() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.liveAgentsLocked()
}
