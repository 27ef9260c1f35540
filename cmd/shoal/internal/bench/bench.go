package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Config is one bench run; its zero value runs one agent through one turn
// of 100,000 deltas as fast as the stand-in can print them, on an
// embedded server.
type Config struct {
	// URL is the fabric to measure; an embedded server when empty.
	URL string
	// Exe is the shoal binary, which runs the node and the stand-in;
	// this process's executable when empty.
	Exe string
	// Dir holds the embedded server's store, the node's directory and the
	// stand-in's script; a temporary directory, removed after, when empty.
	Dir string
	// Agents run at once on the node; 1 when zero.
	Agents int
	// Events is the number of text deltas in each turn; 100,000 when zero.
	Events int
	// Turns each agent runs, one after another; 1 when zero.
	Turns int
	// Rate is each stand-in's deltas per second; as fast as it can when zero.
	Rate float64
	// ReplayAgents is how many agents a following replay watches; 8 when
	// zero (every agent when there are fewer).
	ReplayAgents int
	// Progress gets a line as each phase starts; nothing when nil.
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.Agents == 0 {
		c.Agents = 1
	}
	if c.Events == 0 {
		c.Events = 100_000
	}
	if c.Turns == 0 {
		c.Turns = 1
	}
	if c.ReplayAgents == 0 {
		c.ReplayAgents = 8
	}
	c.ReplayAgents = min(c.ReplayAgents, c.Agents)
}

// Report is what a run measured.
type Report struct {
	Fabric        string  `json:"fabric"` // "embedded" or the URL
	Agents        int     `json:"agents"`
	Turns         int     `json:"turns"`
	EventsPerTurn int     `json:"events_per_turn"`
	Rate          float64 `json:"rate"` // per agent; 0 for as fast as it can

	// Events is how many events the run's turns stored, of every kind.
	Events int64 `json:"events"`
	// NodeRate is Events over the time from the first delta printed to
	// the last result seen by the core subscriber.
	NodeRate float64 `json:"node_events_per_s"`
	// RawRate is the same number of the same envelopes published with
	// raw JetStream async publishes (a window of 512) to the same
	// server, until a core subscriber has seen the last.
	RawRate float64 `json:"raw_jetstream_events_per_s"`
	Ratio   float64 `json:"ratio"`

	// From the stand-in's stdout line to: stored in the stream (the
	// server's timestamp), a core subscriber of agent.<id>, a following
	// replay (client.Replay with follow) of ReplayAgents agents.
	Stored Latency `json:"stored"`
	Core   Latency `json:"core_subscriber"`
	Replay Latency `json:"following_replay"`
	// Bus is not measured yet: the Kaimon bus to a ZMQ subscriber.
	Bus *Latency `json:"bus"`

	Open Latency `json:"open"`
	// NodeRSS is the node process's resident memory before the opens and
	// with every agent open and idle; NodeRSSPerAgent their difference
	// per agent (the CLI processes are not in it). Zero where /proc is
	// missing.
	NodeRSSBefore   int64   `json:"node_rss_before_bytes"`
	NodeRSSOpen     int64   `json:"node_rss_open_bytes"`
	NodeRSSAfter    int64   `json:"node_rss_after_bytes"`
	NodeRSSPerAgent float64 `json:"node_rss_per_agent_bytes"`

	Verified Verified `json:"verified"`
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
	// Problems are the first few things found wrong.
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether every stream was gapless and every turn ended.
func (v Verified) OK(agents int) bool {
	return v.Gapless == agents && v.TurnsEnded == v.TurnsExpected && len(v.Problems) == 0
}

// agent is what the core subscriber and the replay count for one agent.
type agent struct {
	id      string
	results atomic.Int64 // seen by the core subscriber
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
	rep := &Report{Fabric: cfg.URL, Agents: cfg.Agents, Turns: cfg.Turns, EventsPerTurn: cfg.Events, Rate: cfg.Rate}
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

	node, err := startNode(cfg.Exe, url, cfg.Dir, cfg.Events, cfg.Rate)
	if err != nil {
		return nil, err
	}
	defer node.stop()
	if err := node.ready(ctx, f); err != nil {
		return nil, err
	}
	say("node %s (pid %d) ready; opening %d agents", node.name, node.cmd.Process.Pid, cfg.Agents)

	rep.NodeRSSBefore = node.rss()
	agents, opens, err := openAgents(ctx, f, node.name, cfg.Dir, cfg.Agents)
	defer closeAgents(ctx, f, agents)
	if err != nil {
		return nil, err
	}
	rep.Open = opens.latency()
	rep.NodeRSSOpen = node.rss()
	if rep.NodeRSSBefore > 0 && rep.NodeRSSOpen > 0 {
		rep.NodeRSSPerAgent = float64(rep.NodeRSSOpen-rep.NodeRSSBefore) / float64(cfg.Agents)
	}

	obs, err := nats.Connect(url, nats.Name("shoal bench observer"))
	if err != nil {
		return nil, err
	}
	defer obs.Close()
	byID := make(map[string]*agent, len(agents))
	for _, a := range agents {
		byID[a.id] = a
	}
	var core samples
	var firstPrinted atomic.Int64
	var lastResult atomic.Int64
	var results atomic.Int64
	sub, err := obs.Subscribe(schemas.EventSubjects, func(m *nats.Msg) {
		a := byID[m.Subject[len("agent."):]]
		if a == nil {
			return
		}
		now := time.Now().UnixNano()
		if _, printed, ok := stamp(m.Data); ok {
			core.add(now - printed)
			for {
				old := firstPrinted.Load()
				if (old != 0 && old <= printed) || firstPrinted.CompareAndSwap(old, printed) {
					break
				}
			}
			return
		}
		if bytes.HasPrefix(m.Data, []byte(`{"kind":"result"`)) {
			a.results.Add(1)
			results.Add(1)
			lastResult.Store(now)
		}
	})
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	if err := obs.Flush(); err != nil {
		return nil, err
	}

	replayCtx, stopReplay := context.WithCancel(ctx)
	defer stopReplay()
	var replayLat samples
	replayDone := make(chan error, 1)
	replayStarted := make(chan struct{})
	var replayResults atomic.Int64
	var startOnce sync.Once
	sample := make([]string, cfg.ReplayAgents)
	for i := range sample {
		sample[i] = agents[i].id
	}
	go func() {
		replayDone <- f.Replay(replayCtx, sample, client.From{}, true, func(r client.Replayed, g *client.Gap) error {
			startOnce.Do(func() { close(replayStarted) })
			if g != nil {
				return nil // the verification below reports it
			}
			if r.Delta {
				if _, printed, ok := stamp(r.Raw); ok {
					replayLat.add(time.Now().UnixNano() - printed)
				}
				return nil
			}
			if r.Kind == schemas.KindResult && replayResults.Add(1) == int64(len(sample)*cfg.Turns) {
				return errDone
			}
			return nil
		})
	}()
	select {
	case <-replayStarted:
	case err := <-replayDone:
		return nil, fmt.Errorf("the following replay ended before the turns: %v", err)
	case <-time.After(30 * time.Second):
		return nil, errors.New("the following replay delivered nothing in 30s")
	}

	say("%d agents × %d turns × %d deltas", cfg.Agents, cfg.Turns, cfg.Events)
	for t := 1; t <= cfg.Turns; t++ {
		err := parallel(len(agents), 16, func(i int) error {
			_, err := f.Send(ctx, schemas.SendRequest{AgentID: agents[i].id, Text: fmt.Sprintf("turn %d", t)})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("send turn %d: %w", t, err)
		}
		if err := waitFor(ctx, func() int64 { return results.Load() }, int64(len(agents)*t), func() string {
			return fmt.Sprintf("turn %d: %d of %d agents' results seen; node: %s", t, results.Load()-int64(len(agents)*(t-1)), len(agents), node.output())
		}); err != nil {
			return nil, err
		}
	}
	rep.NodeRSSAfter = node.rss()
	rep.Core = core.latency()

	select {
	case err := <-replayDone:
		if err != nil && !errors.Is(err, errDone) {
			return nil, fmt.Errorf("the following replay: %w", err)
		}
	case <-time.After(time.Minute):
		return nil, fmt.Errorf("the following replay saw %d of %d results a minute after the core subscriber had them all", replayResults.Load(), len(sample)*cfg.Turns)
	}
	rep.Replay = replayLat.latency()

	say("checking every agent's stream")
	var stored samples
	envelopes, err := verify(ctx, f, agents, cfg.Turns, rep, &stored)
	if err != nil {
		return nil, err
	}
	rep.Stored = stored.latency()
	if first, last := firstPrinted.Load(), lastResult.Load(); first > 0 && last > first {
		rep.NodeRate = float64(rep.Events) / (float64(last-first) / 1e9)
	}

	say("raw JetStream async publishes of %d of the same envelopes", rep.Events)
	rep.RawRate, err = rawPublish(ctx, url, obs, envelopes, int(rep.Events))
	if err != nil {
		return nil, err
	}
	if rep.RawRate > 0 {
		rep.Ratio = rep.NodeRate / rep.RawRate
	}
	return rep, nil
}

var errDone = errors.New("done")

// openAgents opens n agents on node, 16 at a time, timing each open.
func openAgents(ctx context.Context, f client.Client, node, dir string, n int) ([]*agent, *samples, error) {
	agents := make([]*agent, n)
	var opens samples
	err := parallel(n, 16, func(i int) error {
		start := time.Now()
		r, err := f.Open(ctx, schemas.OpenRequest{CWD: dir, Node: node})
		if err != nil {
			return fmt.Errorf("open agent %d: %w", i+1, err)
		}
		opens.addDuration(time.Since(start))
		agents[i] = &agent{id: r.AgentID}
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

// rawPublish publishes total envelopes, cycling through envelopes, with
// raw JetStream async publishes to a subject of the stream, and returns
// the rate at which a core subscriber on obs saw them all.
func rawPublish(ctx context.Context, url string, obs *nats.Conn, envelopes [][]byte, total int) (float64, error) {
	if len(envelopes) == 0 || total == 0 {
		return 0, errors.New("no envelopes to publish raw")
	}
	pc, err := nats.Connect(url, nats.Name("shoal bench raw publisher"))
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	js, err := jetstream.New(pc, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		return 0, err
	}
	subject := agentSubject(fmt.Sprintf("bench-raw-%d-%d", os.Getpid(), time.Now().UnixNano()))
	var seen atomic.Int64
	sub, err := obs.Subscribe(subject, func(*nats.Msg) { seen.Add(1) })
	if err != nil {
		return 0, err
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	if err := obs.Flush(); err != nil {
		return 0, err
	}
	start := time.Now()
	for i := range total {
		m := nats.NewMsg(subject)
		m.Data = envelopes[i%len(envelopes)]
		m.Header.Set(schemas.HeaderMsgID, fmt.Sprintf("%s.%d", subject, i+1))
		// A full window waits for acknowledgements as long as it takes, as
		// the node's publisher does, rather than the default 200ms.
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			return 0, fmt.Errorf("raw publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, errors.New("raw publishes not acknowledged in 5 minutes")
	}
	if err := waitFor(ctx, seen.Load, int64(total), func() string {
		return fmt.Sprintf("the core subscriber saw %d of %d raw publishes", seen.Load(), total)
	}); err != nil {
		return 0, err
	}
	return float64(total) / time.Since(start).Seconds(), nil
}
