package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Config is one bench run; its zero value runs one agent on one node
// through three turns of 100,000 deltas as fast as the stand-in can print
// them, on an embedded server.
type Config struct {
	// URL is the fabric to measure; an embedded server when empty.
	URL string
	// Exe is the shoal binary, which runs the node and the stand-in;
	// this process's executable when empty.
	Exe string
	// Dir holds the embedded server's store, the node's directory and the
	// stand-in's script; a temporary directory, removed after, when empty.
	Dir string
	// Nodes is how many node processes run the agents; 1 when zero.
	Nodes int
	// Agents run at once, spread over the nodes; 1 when zero.
	Agents int
	// Events is the number of text deltas in each turn; 100,000 when zero.
	Events int
	// Turns each agent runs, one after another; 3 when zero. Each round
	// of turns is followed by the raw baseline's publishes, so drift in
	// the machine's speed touches both alike.
	Turns int
	// Rate is each stand-in's deltas per second; as fast as it can when zero.
	Rate float64
	// Publish is how the nodes publish their events (shoal node
	// --publish): "batches" when empty, or "async".
	Publish string
	// ReplayAgents is how many agents a following replay watches; 8 when
	// zero (every agent when there are fewer).
	ReplayAgents int
	// Fleet is how many fake nodes register for the fleet figure, after
	// the rest is measured, with FleetOpens agents opened through
	// placement among them and FleetBeat their heartbeat interval (a
	// real node's when zero); none when Fleet is zero.
	Fleet      int
	FleetOpens int
	FleetBeat  time.Duration
	// Profile is a file the (first) node process writes a Go CPU profile
	// to, from its start to its end; none when empty.
	Profile string
	// Progress gets a line as each phase starts; nothing when nil.
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.Agents == 0 {
		c.Agents = 1
	}
	if c.Events == 0 {
		c.Events = 100_000
	}
	if c.Turns == 0 {
		c.Turns = 3
	}
	if c.ReplayAgents == 0 {
		c.ReplayAgents = 8
	}
	c.ReplayAgents = min(c.ReplayAgents, c.Agents)
}

// AnchorRate is an anchor's events/s and the node's ratio to it.
type AnchorRate struct {
	Anchor Anchor  `json:"anchor"`
	Rate   float64 `json:"events_per_s"`
	Ratio  float64 `json:"node_ratio"`
}

// Report is what a run measured.
type Report struct {
	Fabric        string  `json:"fabric"` // "embedded" or the URL
	Nodes         int     `json:"nodes"`
	Agents        int     `json:"agents"`
	Turns         int     `json:"turns"`
	EventsPerTurn int     `json:"events_per_turn"`
	Rate          float64 `json:"rate"` // per agent; 0 for as fast as it can

	// Events is how many events the run's turns stored, of every kind.
	Events int64 `json:"events"`
	// NodeRate is the events of each round of turns over the time from
	// its first delta printed to its last result seen by the core
	// subscriber, summed over the rounds.
	NodeRate float64 `json:"node_events_per_s"`
	// RawRate is the same number of the same envelopes, under the node's
	// headers, published with raw JetStream async publishes (a window of
	// 512) to the same server after each round, over the time until the
	// core subscriber has seen the last; a following replay watches them
	// as one watches the node's. It is AnchorAsyncDedup's rate.
	RawRate float64 `json:"raw_jetstream_events_per_s"`
	Ratio   float64 `json:"ratio"`
	// Anchors are every anchor's rate, measured the same way after each
	// round, and the node's ratio to each.
	Anchors []AnchorRate `json:"anchors"`
	// BareRate is the node's events/s in the bare rounds, before the
	// watched ones: nobody reads the stream meanwhile, as in nats bench;
	// BareAnchors the anchors' rates measured the same way.
	BareRate    float64      `json:"bare_node_events_per_s"`
	BareAnchors []AnchorRate `json:"bare_anchors"`
	// BareFloor is the floor's events/s in the bare rounds (floor.go: as
	// many of the same stand-ins, each line published straight to
	// JetStream) and the node's ratio to it.
	BareFloor AnchorRate `json:"bare_floor"`

	// From the stand-in's stdout line to: stored in the stream (the
	// server's timestamp), a core subscriber of agent.<id>, the Kaimon
	// bus's ZeroMQ subscriber, a following replay (client.Replay with
	// follow) of ReplayAgents agents.
	Stored Latency `json:"stored"`
	// StoredBare is stored's latency in the bare rounds.
	StoredBare Latency `json:"stored_bare"`
	Core       Latency `json:"core_subscriber"`
	Bus        Latency `json:"bus"`
	Replay     Latency `json:"following_replay"`
	// The floor's latency (floor.go: as many stand-ins read by a process
	// that publishes each line straight to JetStream), to stored in the
	// bare rounds and, in a paced run (Rate > 0), to stored and to the bus
	// in the watched ones: what the node's are read against.
	FloorStored     Latency `json:"floor_stored,omitzero"`
	FloorStoredBare Latency `json:"floor_stored_bare,omitzero"`
	FloorBus        Latency `json:"floor_bus,omitzero"`

	// BusRate is a fresh bus's events/s from the stream to a ZeroMQ
	// subscriber, for the run's stored events; RawZMQRate the same
	// number of the same two-frame messages over plain zmq4 PUB/SUB.
	BusEvents  int64   `json:"bus_events"`
	BusRate    float64 `json:"bus_events_per_s"`
	RawZMQRate float64 `json:"raw_zmq_events_per_s"`
	BusRatio   float64 `json:"bus_ratio"`

	Open Latency `json:"open"`
	// NodeRSS is the node processes' resident memory before the opens and
	// with every agent open and idle; NodeRSSPerAgent their difference
	// per agent (the CLI processes are not in it). Zero where /proc is
	// missing.
	NodeRSSBefore   int64   `json:"node_rss_before_bytes"`
	NodeRSSOpen     int64   `json:"node_rss_open_bytes"`
	NodeRSSAfter    int64   `json:"node_rss_after_bytes"`
	NodeRSSPerAgent float64 `json:"node_rss_per_agent_bytes"`

	Verified Verified `json:"verified"`

	// Fleet is the fleet figure: fake nodes registered, their heartbeat
	// load on the server and placement among them; nil when not run.
	Fleet *FleetReport `json:"fleet,omitempty"`
}

// Verified is what the bench checked in the stream after the turns.
type Verified struct {
	// Gapless counts the agents whose events are numbered 1, 2, … with
	// no gap, no stray and every delta the stand-in printed, in order.
	Gapless int `json:"gapless_agents"`
	// TurnsEnded counts the turns that ended with a result whose output
	// count (what the stand-in says it printed) matches the deltas stored.
	TurnsEnded    int   `json:"turns_ended"`
	TurnsExpected int   `json:"turns_expected"`
	Deltas        int64 `json:"deltas"`
	// Stored counts the agents' events in the stream, the opens' too.
	Stored int64 `json:"stored_events"`
	// Problems are the first few things found wrong.
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether every stream was gapless and every turn ended.
func (v Verified) OK(agents int) bool {
	return v.Gapless == agents && v.TurnsEnded == v.TurnsExpected && len(v.Problems) == 0
}

// agent is one agent the bench opened.
type agent struct {
	id   string
	node string
}

// Run measures cfg's fabric and returns the report; an error if it could
// not run. A run whose streams are not gapless returns its report with
// the problems in Verified.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	began := time.Now()
	say := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
		}
	}
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the shoal binary: %w", err)
		}
		cfg.Exe = exe
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "shoal-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	rep := &Report{Fabric: cfg.URL, Nodes: cfg.Nodes, Agents: cfg.Agents, Turns: cfg.Turns, EventsPerTurn: cfg.Events, Rate: cfg.Rate}
	url := cfg.URL
	if url == "" {
		b, err := embedded(ctx, cfg.Dir)
		if err != nil {
			return nil, err
		}
		defer b.Shutdown()
		url, rep.Fabric = b.ClientURL(), "embedded"
		say("embedded NATS server with JetStream on %s", url)
	}
	nc, err := nats.Connect(url, nats.Name("shoal bench"))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		return nil, err
	}
	// As a long-lived client does: one watch of the nodes serves
	// placement and every open's watch for its node's loss.
	if err := f.WatchNodes(ctx); err != nil {
		return nil, err
	}

	nodes, err := startNodes(ctx, f, url, cfg)
	defer nodes.stop()
	if err != nil {
		return nil, err
	}
	say("%d node processes ready (%s); opening %d agents", len(nodes), nodes.pids(), cfg.Agents)

	rep.NodeRSSBefore = nodes.rss()
	agents, opens, err := openAgents(ctx, f, nodes, cfg.Dir, cfg.Agents)
	defer closeAgents(ctx, f, agents)
	if err != nil {
		return nil, err
	}
	rep.Open = opens.latency()
	rep.NodeRSSOpen = nodes.rss()
	if rep.NodeRSSBefore > 0 && rep.NodeRSSOpen > 0 {
		rep.NodeRSSPerAgent = float64(rep.NodeRSSOpen-rep.NodeRSSBefore) / float64(cfg.Agents)
	}

	obs, err := nats.Connect(url, nats.Name("shoal bench observer"))
	if err != nil {
		return nil, err
	}
	defer obs.Close()
	w, err := watch(ctx, obs, agents)
	if err != nil {
		return nil, err
	}
	defer w.stop()

	// The live bus carries every event on the stream, the node's and the
	// raw baseline's alike, so both are measured under the same load.
	var liveFloor atomic.Pointer[floor]
	liveBus, err := startBus(ctx, url, cfg.Dir, "live", nil, false, 0, func(channel string, payload []byte) {
		_, printed, ok := stamp(payload)
		switch {
		case !ok:
		case w.byChannel[channel] != nil:
			w.bus.add(time.Now().UnixNano() - printed)
		case liveFloor.Load() != nil && channel == liveFloor.Load().channel():
			liveFloor.Load().bus.add(time.Now().UnixNano() - printed)
		}
	})
	if err != nil {
		return nil, err
	}
	defer liveBus.stop()

	sample := make([]string, cfg.ReplayAgents)
	for i := range sample {
		sample[i] = agents[i].id
	}
	follow, err := followReplay(ctx, f, sample, cfg.Turns)
	if err != nil {
		return nil, err
	}
	defer follow.stop()

	raws := make([]*rawBaseline, len(Anchors))
	for i, way := range Anchors {
		raw, err := newRawBaseline(ctx, way, url, nodes[0].name, obs, f)
		if err != nil {
			return nil, err
		}
		defer raw.close()
		raws[i] = raw
	}

	then := ""
	if cfg.Rate > 0 {
		then = " the floor (as many stand-ins, each line straight to JetStream), then"
	}
	say("%d agents × %d turns × %d deltas; after each round of turns,%s as many of the same envelopes straight to JetStream, each anchor's way", cfg.Agents, cfg.Turns, cfg.Events, then)
	var nodeTime time.Duration
	rawTime := make([]time.Duration, len(raws))
	var nodeEvents int64
	for t := 1; t <= cfg.Turns; t++ {
		w.beginRound()
		err := parallel(len(agents), 16, func(i int) error {
			_, err := f.Send(ctx, schemas.SendRequest{AgentID: agents[i].id, Text: fmt.Sprintf("turn %d", t)})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("send turn %d: %w", t, err)
		}
		if err := waitFor(ctx, w.results.Load, int64(len(agents)*t), func() string {
			return fmt.Sprintf("turn %d: %d of %d agents' results seen; node: %s", t, w.results.Load()-int64(len(agents)*(t-1)), len(agents), nodes.output())
		}); err != nil {
			return nil, err
		}
		took, events := w.endRound()
		nodeTime += took
		nodeEvents += events
		if cfg.Rate > 0 {
			// The floor right after the node's round, under the same watchers.
			if liveFloor.Load() == nil {
				fl, err := newFloor(ctx, url, nodes[0].name, cfg.Exe, cfg.Publish, cfg.Events, cfg.Rate, w.captured())
				if err != nil {
					return nil, err
				}
				defer fl.close()
				liveFloor.Store(fl)
			}
			if err := liveFloor.Load().round(ctx, len(agents)); err != nil {
				return nil, fmt.Errorf("the floor, round %d: %w", t, err)
			}
		}
		for i, raw := range raws {
			d, err := raw.publish(ctx, w.captured(), int(events))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", raw.way, err)
			}
			rawTime[i] += d
		}
	}
	if fl := liveFloor.Load(); fl != nil {
		// The bus has the floor's last events soon after the stream.
		if err := waitFor(ctx, func() int64 { return int64(fl.bus.count()) }, fl.published, func() string {
			return fmt.Sprintf("the bus delivered %d of the floor's %d events", fl.bus.count(), fl.published)
		}); err != nil {
			return nil, err
		}
		rep.FloorStored, rep.FloorBus = fl.stored.latency(), fl.bus.latency()
	}
	rep.NodeRSSAfter = nodes.rss()
	rep.Core = w.core.latency()
	if nodeTime > 0 {
		rep.NodeRate = float64(nodeEvents) / nodeTime.Seconds()
		for i, way := range Anchors {
			if rawTime[i] <= 0 {
				continue
			}
			a := AnchorRate{Anchor: way, Rate: float64(nodeEvents) / rawTime[i].Seconds()}
			a.Ratio = rep.NodeRate / a.Rate
			rep.Anchors = append(rep.Anchors, a)
			if way == AnchorAsyncDedup {
				rep.RawRate, rep.Ratio = a.Rate, a.Ratio
			}
		}
	}
	if err := follow.wait(); err != nil {
		return nil, err
	}
	rep.Replay = follow.lat.latency()

	// The bare rounds come after the watched ones, once nobody watches:
	// a replay that followed the agents from their start would otherwise
	// have their events to read first.
	follow.stop()
	w.stop()
	liveBus.stop()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	say("%d agents × %d bare turns × %d deltas, nobody reading the stream; after each round, the floor (%d stand-ins, each line straight to JetStream), then as many of the same envelopes straight to JetStream, each anchor's way", cfg.Agents, cfg.Turns, cfg.Events, cfg.Agents)
	bareFloor, err := newFloor(ctx, url, nodes[0].name, cfg.Exe, cfg.Publish, cfg.Events, cfg.Rate, w.captured())
	if err != nil {
		return nil, err
	}
	defer bareFloor.close()
	if rep.BareRate, rep.BareAnchors, err = bareRounds(ctx, url, nodes[0].name, f, js, agents, cfg.Turns, w.captured(), bareFloor); err != nil {
		return nil, fmt.Errorf("the bare rounds: %w; node: %s", err, nodes.output())
	}
	rep.FloorStoredBare = bareFloor.stored.latency()
	rep.BareFloor = AnchorRate{Anchor: AnchorFloor, Rate: bareFloor.throughput()}
	if rep.BareFloor.Rate > 0 {
		rep.BareFloor.Ratio = rep.BareRate / rep.BareFloor.Rate
	}

	say("checking every agent's stream")
	var bareStored, stored samples
	if err := verify(ctx, f, agents, 2*cfg.Turns, cfg.Turns, rep, &bareStored, &stored); err != nil { // the watched rounds, then the bare
		return nil, err
	}
	rep.StoredBare, rep.Stored = bareStored.latency(), stored.latency()
	rep.Bus = w.bus.latency()

	say("a fresh Kaimon bus for the agents' %d stored events, then plain zmq4 PUB/SUB of as many of the same messages", rep.Verified.Stored)
	ids := make([]string, len(agents))
	for i, a := range agents {
		ids[i] = a.id
	}
	rep.BusEvents, rep.BusRate, err = drainBus(ctx, url, cfg.Dir, ids, rep.Verified.Stored)
	if err != nil {
		return nil, err
	}
	rep.RawZMQRate, err = bridge.RawZMQ(ctx, "ipc://"+filepath.Join(cfg.Dir, "raw-zmq.sock"), busFrames(agents[0].id, w.captured(), int(rep.BusEvents)))
	if err != nil {
		return nil, fmt.Errorf("raw zmq4: %w", err)
	}
	if rep.RawZMQRate > 0 {
		rep.BusRatio = rep.BusRate / rep.RawZMQRate
	}
	if cfg.Fleet > 0 {
		say("%d fake nodes registering, beating and taking %d opens through placement", cfg.Fleet, cfg.FleetOpens)
		rep.Fleet, err = Fleet(ctx, FleetConfig{URL: url, Nodes: cfg.Fleet, Opens: cfg.FleetOpens, Beat: cfg.FleetBeat, Progress: cfg.Progress})
		if err != nil {
			return nil, fmt.Errorf("the fleet figure: %w", err)
		}
	}
	return rep, nil
}

var errDone = errors.New("done")

// openAgents opens n agents, 16 at a time, timing each open: agent i on
// node i mod len(nodes), named, so a fabric's other nodes get none.
func openAgents(ctx context.Context, f client.Client, nodes nodeProcs, dir string, n int) ([]*agent, *samples, error) {
	agents := make([]*agent, n)
	var opens samples
	err := parallel(n, 16, func(i int) error {
		node := nodes[i%len(nodes)].name
		start := time.Now()
		r, err := f.Open(ctx, schemas.OpenRequest{CWD: dir, Node: node})
		if err != nil {
			return fmt.Errorf("open agent %d on %s: %w", i+1, node, err)
		}
		opens.addDuration(time.Since(start))
		agents[i] = &agent{id: r.AgentID, node: node}
		return nil
	})
	var opened []*agent
	for _, a := range agents {
		if a != nil {
			opened = append(opened, a)
		}
	}
	return opened, &opens, err
}

// closeAgents closes what the run opened, also when the run's context
// has ended.
func closeAgents(ctx context.Context, f client.Client, agents []*agent) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	parallel(len(agents), 16, func(i int) error {
		f.Close(ctx, schemas.AgentRequest{AgentID: agents[i].id})
		return nil
	})
}

// parallel runs fn(0) … fn(n-1) on at most workers goroutines and returns
// the first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range min(n, workers) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// waitFor polls count until it reaches want; it fails when the count has
// not moved for a minute.
func waitFor(ctx context.Context, count func() int64, want int64, why func() string) error {
	last, moved := count(), time.Now()
	for {
		c := count()
		if c >= want {
			return nil
		}
		if c != last {
			last, moved = c, time.Now()
		} else if time.Since(moved) > time.Minute {
			return fmt.Errorf("no progress for a minute: %s", why())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
