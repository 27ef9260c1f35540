package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// FleetConfig is one fleet run: Nodes fake nodes registered on the fabric
// at URL, and Opens agents opened through placement among them. Its zero
// value, with a URL, registers 100 nodes and opens 1,000 agents.
type FleetConfig struct {
	// URL is the fabric: a NATS server that already has Shoal's stream
	// and buckets. Required.
	URL string
	// Nodes is how many fake nodes register; 100 when zero.
	Nodes int
	// Opens is how many agents are opened, 16 at a time; 1,000 when zero.
	Opens int
	// Beat is the fakes' heartbeat interval; when zero, the one a real
	// node uses: a third of the nodes bucket's TTL, at most 5s.
	Beat time.Duration
	// Progress gets a line as each phase starts; nothing when nil.
	Progress io.Writer
}

func (c *FleetConfig) defaults() {
	if c.Nodes == 0 {
		c.Nodes = 100
	}
	if c.Opens == 0 {
		c.Opens = 1000
	}
}

// FleetReport is what a fleet run measured.
type FleetReport struct {
	// NodesRegistered counts the fake nodes placement saw, each with a
	// ready claude backend, before the heartbeat window began.
	NodesRegistered int `json:"nodes_registered"`
	// HeartbeatInterval is how often each fake wrote its record, and
	// NodeTTL how long the nodes bucket keeps a record without one.
	HeartbeatInterval float64       `json:"heartbeat_interval_ms"`
	NodeTTL           float64       `json:"node_ttl_ms"`
	Heartbeat         HeartbeatLoad `json:"heartbeat"`

	// Opens counts the agents opened; a run in which one fails returns an
	// error instead of a report.
	Opens int `json:"opens"`
	// Placement is the time of each client.Open naming no node, as the
	// coordinator serves it: placement on its followed view of the nodes
	// bucket, the claim of the id in the agents bucket, the request to the
	// chosen fake, its take-up of the claim and the rewrite of its record,
	// and the reply.
	Placement Latency `json:"placement"`
	// How the opens spread: the nodes that took at least one, and the
	// fewest and most any registered node took.
	NodesUsed       int `json:"nodes_used"`
	MinOpensPerNode int `json:"min_opens_per_node"`
	MaxOpensPerNode int `json:"max_opens_per_node"`
}

// HeartbeatLoad is the load the fakes' heartbeats put on the server,
// measured over a window of three heartbeat intervals once every fake had
// registered and before the first open, when the beats are all that is
// written to the nodes bucket and all that crosses the fakes' connections.
type HeartbeatLoad struct {
	Window float64 `json:"window_s"`
	// Puts is how far the last sequence number of the nodes bucket's
	// stream moved during the window, as its stream info reports it: the
	// records the server stored. It counts every writer of the bucket,
	// so on a fabric with real nodes their beats are in it too.
	Puts       uint64  `json:"puts"`
	MsgsPerSec float64 `json:"msgs_per_s"`
	// BytesInPerSec is what the fakes' connections sent the server during
	// the window, and BytesOutPerSec what the server sent them back (the
	// stream's acknowledgements), as their nats.Conn statistics count
	// it: message headers and payloads, not the protocol's framing.
	BytesInPerSec  float64 `json:"bytes_in_per_s"`
	BytesOutPerSec float64 `json:"bytes_out_per_s"`
	// WatchMsgsPerSec and WatchBytesPerSec are what the server sent one
	// follower of the bucket during the window (this run's client, which
	// follows it as the coordinator and the MCP endpoint do): every beat
	// goes to every follower.
	WatchMsgsPerSec  float64 `json:"watch_msgs_per_s"`
	WatchBytesPerSec float64 `json:"watch_bytes_per_s"`
	// RecordBytes is the size of one fake's record as it last wrote it.
	RecordBytes int `json:"record_bytes"`
	// FailedBeats counts the heartbeat writes that failed, over the run.
	FailedBeats int64 `json:"failed_beats"`
}

// fleetLabel is the label every fake of a run carries, and every open of
// the run asks for: placement still weighs each node of the fabric, but
// only the run's fakes fit, so no open starts an agent on a real node.
const fleetLabel = "shoal-bench-fleet"

// Fleet registers cfg.Nodes fake nodes on cfg.URL, measures their
// heartbeats' load on the server, then opens cfg.Opens agents through
// placement, timing each. Each fake has a NATS connection of its own, as
// a node does, and writes its record and answers opens as a node does,
// with no CLI behind it. Everything is gone from the fabric, and every
// connection closed, when Fleet returns.
func Fleet(ctx context.Context, cfg FleetConfig) (*FleetReport, error) {
	cfg.defaults()
	switch {
	case cfg.URL == "":
		return nil, errors.New("fleet: no fabric URL")
	case cfg.Nodes < 0:
		return nil, fmt.Errorf("fleet: the number of nodes must not be negative, got %d", cfg.Nodes)
	case cfg.Opens < 0:
		return nil, fmt.Errorf("fleet: the number of opens must not be negative, got %d", cfg.Opens)
	case cfg.Beat < 0:
		return nil, fmt.Errorf("fleet: heartbeat interval %s is negative", cfg.Beat)
	}
	began := time.Now()
	say := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	nc, err := nats.Connect(cfg.URL, nats.Name("shoal bench fleet"))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.URL, err)
	}
	defer nc.Close()
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		return nil, err
	}
	nodes, err := f.JetStream().KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	st, err := nodes.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read KV bucket %s: %w", schemas.NodesBucket, err)
	}
	ttl := st.TTL()
	if cfg.Beat == 0 {
		cfg.Beat = beatInterval(ttl)
	}
	if ttl > 0 && cfg.Beat >= ttl {
		return nil, fmt.Errorf("fleet: heartbeat interval %s is not shorter than the nodes bucket's TTL %s: records would expire between beats", cfg.Beat, ttl)
	}
	rep := &FleetReport{HeartbeatInterval: ms(cfg.Beat), NodeTTL: ms(ttl)}

	run, err := randomHex(3)
	if err != nil {
		return nil, err
	}
	cwd, err := filepath.Abs(os.TempDir())
	if err != nil {
		return nil, err
	}
	say("%d fake nodes (fleet-%s-*), one connection each, beating every %s", cfg.Nodes, run, cfg.Beat)
	fakes := make([]*fakeNode, cfg.Nodes)
	defer stopFakes(ctx, fakes)
	err = parallel(cfg.Nodes, 8, func(i int) error {
		// The first beats are spread over an interval, as those of nodes
		// started at different times are, rather than all at once.
		phase := cfg.Beat * time.Duration(i) / time.Duration(cfg.Nodes)
		fk, err := startFake(ctx, cfg.URL, fmt.Sprintf("fleet-%s-%03d", run, i+1), run, cfg.Beat, phase)
		fakes[i] = fk
		return err
	})
	if err != nil {
		return nil, err
	}
	// Placement follows the nodes bucket, as the coordinator's does.
	if err := f.WatchNodes(ctx); err != nil {
		return nil, fmt.Errorf("follow KV bucket %s: %w", schemas.NodesBucket, err)
	}
	if rep.NodesRegistered, err = registered(ctx, f, run, cfg.Nodes); err != nil {
		return nil, err
	}

	say("%d nodes registered; measuring their heartbeats for %s", rep.NodesRegistered, 3*cfg.Beat)
	if rep.Heartbeat, err = measureBeats(ctx, f.JetStream(), st, nc, fakes, 3*cfg.Beat); err != nil {
		return nil, err
	}

	say("opening %d agents through placement, 16 at a time", cfg.Opens)
	var opens samples
	var mu sync.Mutex
	perNode := map[string]int{}
	err = parallel(cfg.Opens, 16, func(i int) error {
		start := time.Now()
		r, err := f.Open(ctx, schemas.OpenRequest{CWD: cwd, Labels: map[string]string{fleetLabel: run}})
		if err != nil {
			return fmt.Errorf("open agent %d through placement: %w", i+1, err)
		}
		opens.addDuration(time.Since(start))
		mu.Lock()
		perNode[r.Node]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.Placement = opens.latency()
	rep.Opens = rep.Placement.Samples
	rep.NodesUsed = len(perNode)
	for i, fk := range fakes {
		n := perNode[fk.name]
		if i == 0 || n < rep.MinOpensPerNode {
			rep.MinOpensPerNode = n
		}
		rep.MaxOpensPerNode = max(rep.MaxOpensPerNode, n)
		rep.Heartbeat.FailedBeats += fk.failedBeats.Load()
	}
	say("%d opens over %d nodes; removing the fakes and their agents", rep.Opens, rep.NodesUsed)
	return rep, nil
}

// beatInterval is a real node's heartbeat interval for a record TTL, as
// node.newAdvertiser derives it: a third of the TTL, at most 5s.
func beatInterval(ttl time.Duration) time.Duration {
	interval := ttl / 3
	if interval <= 0 || interval > 5*time.Second {
		interval = 5 * time.Second
	}
	return interval
}

// registered waits until placement sees all n of the run's fakes with a
// ready claude backend, and returns how many it sees.
func registered(ctx context.Context, f *client.Direct, run string, n int) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		nodes, err := f.Nodes(ctx)
		if err != nil {
			return 0, err
		}
		seen := 0
		for _, rec := range nodes {
			if rec.Labels[fleetLabel] == run && cannotRunClaude(rec) == "" {
				seen++
			}
		}
		if seen == n {
			return seen, nil
		}
		if time.Now().After(deadline) {
			return seen, fmt.Errorf("placement saw %d of the %d fake nodes registered after 30s", seen, n)
		}
		select {
		case <-ctx.Done():
			return seen, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cannotRunClaude says why a record does not advertise a ready claude
// backend, or "".
func cannotRunClaude(rec schemas.NodeRecord) string {
	for _, b := range rec.Backends {
		if b.Kind == "claude" && b.Ready {
			return ""
		}
	}
	return "no ready claude backend"
}

// measureBeats measures the heartbeat load over window: the stream
// behind the nodes bucket (whose status is st) for what the server
// stored, the fakes' connections for what crossed them, and follower's
// connection for what one follower of the bucket received.
func measureBeats(ctx context.Context, js jetstream.JetStream, st jetstream.KeyValueStatus, follower *nats.Conn, fakes []*fakeNode, window time.Duration) (HeartbeatLoad, error) {
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return HeartbeatLoad{}, fmt.Errorf("KV bucket %s is not backed by a JetStream stream", schemas.NodesBucket)
	}
	stream := bs.StreamInfo().Config.Name
	type reading struct {
		at       time.Time
		lastSeq  uint64
		fakes    nats.Statistics
		follower nats.Statistics
	}
	read := func() (reading, error) {
		s, err := js.Stream(ctx, stream) // reads the stream's info
		if err != nil {
			return reading{}, fmt.Errorf("read stream %s: %w", stream, err)
		}
		r := reading{at: time.Now(), lastSeq: s.CachedInfo().State.LastSeq, follower: follower.Stats()}
		for _, fk := range fakes {
			fs := fk.nc.Stats()
			r.fakes.InMsgs += fs.InMsgs
			r.fakes.OutMsgs += fs.OutMsgs
			r.fakes.InBytes += fs.InBytes
			r.fakes.OutBytes += fs.OutBytes
		}
		return r, nil
	}
	before, err := read()
	if err != nil {
		return HeartbeatLoad{}, err
	}
	select {
	case <-ctx.Done():
		return HeartbeatLoad{}, ctx.Err()
	case <-time.After(window):
	}
	after, err := read()
	if err != nil {
		return HeartbeatLoad{}, err
	}
	secs := after.at.Sub(before.at).Seconds()
	load := HeartbeatLoad{
		Window:           secs,
		Puts:             after.lastSeq - before.lastSeq,
		BytesInPerSec:    float64(after.fakes.OutBytes-before.fakes.OutBytes) / secs,
		BytesOutPerSec:   float64(after.fakes.InBytes-before.fakes.InBytes) / secs,
		WatchMsgsPerSec:  float64(after.follower.InMsgs-before.follower.InMsgs) / secs,
		WatchBytesPerSec: float64(after.follower.InBytes-before.follower.InBytes) / secs,
	}
	load.MsgsPerSec = float64(load.Puts) / secs
	if len(fakes) > 0 {
		load.RecordBytes = fakes[0].recordBytes()
	}
	return load, nil
}

// stopFakes stops every fake that started, also when ctx has ended.
func stopFakes(ctx context.Context, fakes []*fakeNode) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	parallel(len(fakes), 16, func(i int) error {
		if fakes[i] != nil {
			fakes[i].stop(ctx)
		}
		return nil
	})
}

// fakeNode is a node as far as registration and opening go: it keeps its
// record in the nodes bucket, beating on its interval and rewriting it
// when it takes an agent, advertises a ready claude backend, and answers
// open requests by taking up the client's claim in the agents bucket, as
// a node does once its agent has started. No process runs behind an
// agent, and it answers no other verb.
type fakeNode struct {
	name   string
	nc     *nats.Conn
	nodes  jetstream.KeyValue
	agents jetstream.KeyValue
	sub    *nats.Subscription

	stopBeats   context.CancelFunc
	beatsDone   chan struct{}
	failedBeats atomic.Int64

	mu      sync.Mutex
	rec     schemas.NodeRecord // under mu
	size    int                // of the last record written, under mu
	held    []string           // the agents taken up, under mu
	stopped bool               // under mu: no more requests are taken
	work    sync.WaitGroup     // the requests being answered
}

// startFake connects a fake node named name, writes its record once, and
// starts its heartbeat (the first after phase, then every interval) and
// its open endpoint.
func startFake(ctx context.Context, url, name, run string, interval, phase time.Duration) (*fakeNode, error) {
	nc, err := nats.Connect(url, nats.Name("shoal bench fleet node "+name))
	if err != nil {
		return nil, fmt.Errorf("connect fake node %s to %s: %w", name, url, err)
	}
	fk := &fakeNode{name: name, nc: nc}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	if fk.nodes, err = js.KeyValue(ctx, schemas.NodesBucket); err != nil {
		nc.Close()
		return nil, fmt.Errorf("fake node %s: open KV bucket %s: %w", name, schemas.NodesBucket, err)
	}
	if fk.agents, err = js.KeyValue(ctx, schemas.AgentsBucket); err != nil {
		nc.Close()
		return nil, fmt.Errorf("fake node %s: open KV bucket %s: %w", name, schemas.AgentsBucket, err)
	}
	instance, err := randomHex(8)
	if err != nil {
		nc.Close()
		return nil, err
	}
	hostname, _ := os.Hostname()
	fk.rec = schemas.NodeRecord{
		Name: name, Version: "bench-fleet", Instance: instance,
		Labels:    map[string]string{fleetLabel: run},
		Backends:  []schemas.BackendInfo{{Kind: "claude", Version: "fake", Ready: true}},
		Host:      schemas.HostInfo{Hostname: hostname, OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GPUs: []string{}},
		StartedAt: unixSeconds(time.Now()),
	}
	// The open endpoint is up before the record says the node is there.
	fk.sub, err = nc.Subscribe(schemas.ControlSubject(name, schemas.VerbOpen), func(m *nats.Msg) { fk.onOpen(ctx, m) })
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("fake node %s: subscribe to its open requests: %w", name, err)
	}
	if err := fk.write(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("fake node %s: write its record: %w", name, err)
	}
	beatCtx, stopBeats := context.WithCancel(ctx)
	fk.stopBeats, fk.beatsDone = stopBeats, make(chan struct{})
	go fk.beat(beatCtx, interval, phase)
	return fk, nil
}

// beat writes the record after phase and then every interval until ctx
// ends.
func (fk *fakeNode) beat(ctx context.Context, interval, phase time.Duration) {
	defer close(fk.beatsDone)
	first := time.NewTimer(phase)
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := fk.write(ctx); err != nil && ctx.Err() == nil {
			fk.failedBeats.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// write puts the node's record, stamped now, with its current agents.
func (fk *fakeNode) write(ctx context.Context) error {
	fk.mu.Lock()
	fk.rec.Agents = len(fk.held)
	fk.rec.Heartbeat = unixSeconds(time.Now())
	b, _ := json.Marshal(fk.rec)
	fk.size = len(b)
	fk.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := fk.nodes.Put(ctx, fk.name, b)
	return err
}

func (fk *fakeNode) recordBytes() int {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	return fk.size
}

// onOpen answers an open request on a goroutine of its own, as a node
// does, so opens placed on the same node do not queue behind each other.
func (fk *fakeNode) onOpen(ctx context.Context, m *nats.Msg) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	if fk.stopped {
		return
	}
	fk.work.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, schemas.OpenTimeout)
		defer cancel()
		var req schemas.OpenRequest
		var body []byte
		if err := decodeStrict(m.Data, &req); err != nil {
			body = errorReply(schemas.Errf(schemas.CodeInvalid, "invalid open request: %v", err))
		} else if rep, err := fk.open(ctx, req); err != nil {
			body = errorReply(err)
		} else {
			body, _ = json.Marshal(rep)
		}
		m.Respond(body)
	})
}

// open takes up the client's claim of req.ID: the record it wrote, naming
// this node and the request, status starting, becomes the agent's, idle.
// The node's record is rewritten with its new load before the reply goes
// out, as a node's is, since placement reads the load from it.
func (fk *fakeNode) open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	switch {
	case req.Node != fk.name:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "this is node %s, not %s", fk.name, req.Node)
	case !filepath.IsAbs(req.CWD):
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent cwd must be an absolute path on node %s: %s", fk.name, req.CWD)
	}
	model := req.Model
	if model == "" {
		model = schemas.DefaultModel
	}
	if kind, _ := schemas.Route(model); kind != "claude" {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeUnavailable, "node %s cannot run %s agents (it runs: claude)", fk.name, kind)
	}
	if err := schemas.ValidID(req.ID); err != nil {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	rep := schemas.OpenReply{AgentID: req.ID, Node: fk.name}
	now := unixSeconds(time.Now())
	rec := schemas.AgentRecord{ID: req.ID, Model: model, CWD: req.CWD, CreatedAt: now,
		Usage: schemas.Usage{}, Node: fk.name, RequestID: req.RequestID, Parent: req.Parent, Depth: req.Depth}
	e, err := fk.agents.Get(ctx, req.ID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rec.Status, rec.LastActivity = schemas.StatusIdle, now
		b, _ := json.Marshal(rec)
		if _, err := fk.agents.Create(ctx, req.ID, b); err != nil {
			return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (its record changed while opening: %v)", req.ID, err)
		}
	case err != nil:
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeUnavailable, "read the agent's record: %v", err)
	default:
		var old schemas.AgentRecord
		if err := json.Unmarshal(e.Value(), &old); err == nil {
			rec = old
		}
		mine := err == nil && old.Node == fk.name && old.RequestID == req.RequestID
		switch {
		case mine && old.Status == schemas.StatusIdle:
			return rep, nil // a retry of an open this node answered
		case !(mine && old.Status == schemas.StatusStarting) && old.Status != schemas.StatusDead:
			return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (on node %s)", req.ID, old.Node)
		}
		rec.Node, rec.RequestID = fk.name, req.RequestID
		rec.Status, rec.LastActivity = schemas.StatusIdle, now
		b, _ := json.Marshal(rec)
		if _, err := fk.agents.Update(ctx, req.ID, b, e.Revision()); err != nil {
			return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (its record changed while opening)", req.ID)
		}
	}
	fk.mu.Lock()
	fk.held = append(fk.held, req.ID)
	fk.mu.Unlock()
	if err := fk.write(ctx); err != nil {
		fk.failedBeats.Add(1) // the next beat carries the new load
	}
	return rep, nil
}

// stop ends the fake as a node's clean stop does: no more requests, no
// more beats, its record removed; and the records of the agents it took
// up are removed too, so the run leaves nothing in the fabric.
func (fk *fakeNode) stop(ctx context.Context) {
	fk.sub.Unsubscribe()
	fk.mu.Lock()
	fk.stopped = true
	fk.mu.Unlock()
	fk.work.Wait()
	fk.stopBeats()
	<-fk.beatsDone
	fk.nodes.Delete(ctx, fk.name)
	for _, id := range fk.held {
		fk.agents.Delete(ctx, id)
	}
	fk.nc.Close()
}

// errorReply is a control reply carrying err.
func errorReply(err error) []byte {
	ce, ok := errors.AsType[*schemas.ControlError](err)
	if !ok {
		ce = &schemas.ControlError{Code: schemas.CodeInternal, Message: err.Error()}
	}
	b, _ := json.Marshal(schemas.ErrorReply{Error: ce})
	return b
}

// decodeStrict decodes a request as a node does: unknown fields are an
// error.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
