package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/pngscale"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
)

// Config configures a node. Name, Conn and Dir are required; every other
// zero value means a default.
type Config struct {
	// Name identifies the node in the fabric: a subject token.
	Name string
	// Instance names this life of the node (NodeRecord.Instance), as its
	// connections' names say it (schemas.NodeConnName); a fresh one when
	// empty.
	Instance string
	// Conn is the node's connection to the fabric.
	Conn *nats.Conn
	// Dir holds the node's files: <id>.events.jsonl, <id>.log, pids.json
	// and generated agent configs. One node at a time may use it.
	Dir string
	// Backends are the agent kinds this node can run.
	Backends []backend.Backend
	// MCP is the coordinator's MCP endpoint agents are pointed at, its
	// Token the node's key (schemas.NodeKey) from which each agent's own
	// token is derived. A confined node without a key takes the one the
	// coordinator grants it (and the endpoint, when URL is empty).
	MCP backend.MCPEndpoint
	// Env is added to every agent's environment.
	Env []string

	// TurnIdleTimeout interrupts a turn that produced no event for this
	// long; 10m when zero, off when negative.
	TurnIdleTimeout time.Duration
	// TurnTimeout interrupts a turn that ran this long; 2h when zero, off
	// when negative.
	TurnTimeout time.Duration
	// InterruptGrace is how long a watchdog interrupt may take before the
	// agent is stopped; 15s when zero.
	InterruptGrace time.Duration
	// ImageMaxLongEdge downsamples tool-result PNGs to this long edge;
	// 1568 when zero, off when negative.
	ImageMaxLongEdge int
	// MaxDead is how many dead agents are kept for review; 10 when zero.
	MaxDead int
	// Sandbox is the node's sandbox mode: schemas.SandboxOff (the
	// default: agents are sandboxed when their open asks), SandboxOn
	// (unless it declines) or SandboxRequired (always).
	Sandbox string
	// SandboxKind is the strongest sandbox the node gives: "" or
	// schemas.SandboxNamespaces (namespaces of their own around Landlock
	// and seccomp, where this machine allows them), or
	// schemas.SandboxLandlock (Landlock and seccomp alone).
	SandboxKind string
	// OpenTimeout is how long an agent may take to start (an ACP agent's
	// handshake); schemas.OpenTimeout when zero. One that has not started
	// by then is dead, and its stream says why.
	OpenTimeout time.Duration
	// AskTimeout is how long a permission request of an agent that asks
	// waits for a person before it is denied; DefaultAskTimeout when zero.
	AskTimeout time.Duration
	// NoBatches publishes every event with an asynchronous publish of its
	// own even where the stream takes fast batches (for measuring one
	// against the other).
	NoBatches bool
	// PublishWindow bounds unacknowledged publishes; 512 when zero (the
	// window a raw JetStream async publisher is measured with), at most
	// schemas.MaxEventsAhead.
	PublishWindow int
	// OutboxMemory is how many bytes of events the node keeps in memory
	// while the fabric is away; 64 MiB when zero.
	OutboxMemory int
	// OutboxDisk is how many more it keeps on disk, in Dir; 1 GiB when
	// zero, none when negative. Past both, streamed chunks are not kept
	// and running turns are interrupted.
	OutboxDisk int64
	// Version is reported by the node's micro service and record.
	Version string
	// Labels are advertised for placement (e.g. gpu=yes, site=lab).
	Labels map[string]string
	// MaxAgents limits the live agents the node runs; 0 means no limit.
	MaxAgents int
	// KeepFor is how long the checkout of an agent on a repository stays
	// on the node once the agent has ended (for shoal diff and fetch, and
	// a reopen); DefaultKeepFor when zero, forever when negative.
	KeepFor time.Duration
	// RefreshInterval is how often the node asks its backends again what
	// they can run (a CLI installed since, a model pulled); 1m when zero.
	RefreshInterval time.Duration
	// Confined confines the node to its own subjects: it reaches the stream
	// and buckets only through the coordinator's relay, as scoped node
	// credentials require. Its connection must use the inbox prefix
	// schemas.InboxPrefix("node", Name).
	Confined bool
	// NoJournal keeps events in memory only until the stream stores them:
	// a node killed while the fabric is away loses what it held. Without
	// it (the default) every event is written to the node's journal before
	// it is published, and a restarted node publishes what the stream
	// does not have.
	NoJournal bool
	// Reaper is a binary that holds agents' processes (a shoal binary):
	// run as `Reaper __reaper` once per node on Linux, as `Reaper __keeper
	// -- <agent>` once per agent on macOS (proc.Reaper). With it,
	// everything an agent starts, in any session or group, ends with the
	// agent and with the node, even one killed with SIGKILL; without it,
	// an agent's own process group does.
	Reaper string
	// Unreadable are paths no sandboxed agent may be let read: the
	// node's credentials and TLS key, the user's home directory, Shoal's
	// data and configuration directories (the coordinator's signing keys
	// live there). A sandbox whose readable paths (the system's
	// directories, the CLI's install) would hold one is refused, naming
	// it. Dir is always among them.
	Unreadable []string
	// Logger receives the node's log; discarded when nil.
	Logger *slog.Logger
	// Metrics receives what the node counts; nil counts nothing.
	Metrics Metrics
}

func (c Config) withDefaults() Config {
	if c.TurnIdleTimeout == 0 {
		c.TurnIdleTimeout = 10 * time.Minute
	}
	if c.TurnTimeout == 0 {
		c.TurnTimeout = 2 * time.Hour
	}
	if c.InterruptGrace == 0 {
		c.InterruptGrace = 15 * time.Second
	}
	if c.ImageMaxLongEdge == 0 {
		c.ImageMaxLongEdge = pngscale.DefaultMaxLongEdge
	}
	if c.MaxDead == 0 {
		c.MaxDead = 10
	}
	if c.PublishWindow == 0 {
		c.PublishWindow = 512
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = schemas.OpenTimeout
	}
	if c.AskTimeout == 0 {
		c.AskTimeout = DefaultAskTimeout
	}
	if c.Sandbox == "" {
		c.Sandbox = schemas.SandboxOff
	}
	if c.PublishWindow > schemas.MaxEventsAhead {
		c.PublishWindow = schemas.MaxEventsAhead
	}
	if c.OutboxMemory == 0 {
		c.OutboxMemory = 64 << 20
	}
	if c.OutboxDisk == 0 {
		c.OutboxDisk = 1 << 30
	}
	if c.Version == "" {
		c.Version = "0.0.0"
	}
	if c.KeepFor == 0 {
		c.KeepFor = DefaultKeepFor
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	return c
}

// Host is a running node: the agents of one machine.
type Host struct {
	cfg Config
	// journaled is what the restart's journal held of turns' results, by
	// agent (resume), for the records it closes.
	journaled map[string][]journaledResult
	log       *slog.Logger
	js        jetstream.JetStream
	store     store
	// takesAcked says the relay reads schemas.HeaderAcked (its hello
	// says so): the publisher names each agent's last event stored.
	takesAcked bool
	pub        *publisher
	recs       *records
	ads        *advertiser
	// stopSelf ends Run with a cause (takenOver).
	stopSelf context.CancelCauseFunc
	pids     *pidFile
	permits  *permitBook
	nums     *numbers
	maxEvent int
	backends map[string]backend.Backend
	labels   []string // cfg.Labels as budgets name them (schemas.LabelsOf)
	produced produced // what this life's turns used
	ready    chan struct{}
	// agentWork is every goroutine of every agent, requests every
	// request being answered: Run waits for both.
	agentWork sync.WaitGroup
	requests  *service.Server

	sandbox sandboxing
	repos   *repos
	// mcp is the endpoint agents are pointed at, with the node's key: set
	// by Run before any agent starts and, where the coordinator grants it,
	// asked for again at each open (refreshGrant); mcpMu guards it.
	mcpMu sync.Mutex
	mcp   backend.MCPEndpoint
	// granted says the node takes its endpoint from the coordinator's
	// grant, whose relay answers RelayGrant.
	granted bool

	// reaperMu guards the reaper, replaced when it dies, and why the node
	// cannot start agents meanwhile.
	reaperMu  sync.Mutex
	reaper    *proc.Reaper
	unhealthy string

	// mu guards the agent table. Lock order: h.mu before an agent's a.mu
	// (the table is read, and each agent asked whether it is dead, under
	// h.mu); never take h.mu while holding an a.mu.
	mu      sync.Mutex
	agents  map[string]*agent
	runs    map[string]bool
	opening map[string]*opening // opens under way, by agent id
}

// New checks cfg and prepares a node; Run runs it.
func New(cfg Config) (*Host, error) {
	cfg = cfg.withDefaults()
	if err := schemas.ValidNodeName(cfg.Name); err != nil {
		return nil, fmt.Errorf("node name: %w", err)
	}
	if cfg.Conn == nil {
		return nil, errors.New("node needs a NATS connection")
	}
	if cfg.Dir == "" {
		return nil, errors.New("node needs a directory for its files")
	}
	// Absolute, so what a sandbox must keep its agents from (the node's
	// files among it) is compared with the paths it gives them.
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("node directory %s: %w", cfg.Dir, err)
	}
	cfg.Dir = abs
	if want := schemas.InboxPrefix("node", cfg.Name); cfg.Confined && cfg.Conn.Opts.InboxPrefix != want {
		return nil, fmt.Errorf("a confined node's connection must use the inbox prefix %s (nats.CustomInboxPrefix)", want)
	}
	sb := detectSandbox(cfg)
	if err := checkSandboxMode(cfg, sb); err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	h := &Host{
		cfg:      cfg,
		sandbox:  sb,
		log:      cfg.Logger.With("node", cfg.Name),
		js:       js,
		backends: map[string]backend.Backend{},
		labels:   schemas.LabelsOf(cfg.Labels),
		ready:    make(chan struct{}),
		agents:   map[string]*agent{},
		runs:     map[string]bool{},
		opening:  map[string]*opening{},
		// Leave room for headers under the server's limit.
		maxEvent: int(cfg.Conn.MaxPayload()) - 4096,
	}
	for _, b := range cfg.Backends {
		h.backends[b.Kind()] = b
	}
	return h, nil
}

// Ready is closed once the node answers requests.
func (h *Host) Ready() <-chan struct{} { return h.ready }

// Name is the node's name.
func (h *Host) Name() string { return h.cfg.Name }

// Run runs the node until ctx ends: it takes its directory, reaps agents a
// previous instance left behind, and serves the control endpoints. On the
// way out it closes every live agent and stores their last events.
func (h *Host) Run(ctx context.Context) (err error) {
	// The node stops itself, with a cause, when another node took its
	// name while it was away (takenOver).
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	h.stopSelf = stop
	defer func() {
		if cause := context.Cause(ctx); err == nil && errors.Is(cause, errNameTaken) {
			err = cause
		}
	}()
	if err := os.MkdirAll(h.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("node dir: %w", err)
	}
	unlock, err := lockDir(h.cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	hello, err := h.join(ctx)
	switch {
	case err != nil:
		return err
	case hello.NameTaken && h.cfg.Confined:
		// Its credentials name it: another name takes other credentials.
		return schemas.Errf(schemas.CodeConflict, "a node named %s is already running; its credentials name this node %s too: stop the other, or give this one credentials of its own (shoal creds node NAME)", h.cfg.Name, h.cfg.Name)
	case hello.NameTaken:
		return schemas.Errf(schemas.CodeConflict, "a node named %s is already running; give this node another name (shoal node --node-name NAME)", h.cfg.Name)
	}
	// The node names with each event the agent's last event stored, for a
	// relay that reads it (one of an earlier version refuses the header).
	h.takesAcked = hello.TakesAcked
	ttl := time.Duration(hello.NodeTTLMS) * time.Millisecond
	h.mcp = h.cfg.MCP
	if h.cfg.Confined && h.cfg.MCP.Token == "" {
		h.mcp = h.grantedEndpoint(hello.MCP)
		h.granted = hello.Grants
	}
	h.pids = &pidFile{path: filepath.Join(h.cfg.Dir, "pids.json")}
	h.permits = newPermitBook(filepath.Join(h.cfg.Dir, "permits.json"))
	var sp *spill
	if h.cfg.OutboxDisk > 0 {
		if sp, err = openSpill(filepath.Join(h.cfg.Dir, "outbox.spill")); err != nil {
			return err
		}
		defer sp.close()
	}
	// Events go on a connection that buffers nothing while it reconnects:
	// a publish made then fails at once instead of reaching the stream
	// after the reconnect, ahead of the events in flight when the
	// connection broke, which the publisher sends again first.
	events, closeEvents, err := eventConn(h.cfg.Conn)
	if err != nil {
		return err
	}
	defer closeEvents()
	ejs, err := jetstream.New(events, jetstream.WithPublishAsyncMaxPending(2*h.cfg.PublishWindow), jetstream.WithPublishAsyncTimeout(publishAckWait))
	if err != nil {
		return err
	}
	out, err := h.eventSender(ctx, events, ejs)
	if err != nil {
		return err
	}
	pub := newPublisher(out, h.store.lastEvents, h.cfg.PublishWindow, outboxLimits{Memory: h.cfg.OutboxMemory, Disk: h.cfg.OutboxDisk}, sp, h.log)
	pub.onStored = h.cfg.Metrics.EventStored
	if h.takesAcked {
		pub.acked = map[string]uint64{}
	}
	// Nothing goes until the restart has found which lives its journal
	// holds are still its own (reconcileRecords): a coordinator that
	// took the node for lost may be closing them as it starts.
	pub.lapsed = true
	h.mu.Lock()
	h.pub = pub
	h.mu.Unlock()
	j, prev, err := openJournal(filepath.Join(h.cfg.Dir, "journal"), h.log)
	if err != nil {
		return err
	}
	var prevNums numbersFile
	if h.nums, prevNums, err = openNumbers(filepath.Join(h.cfg.Dir, "numbers.json"), j.id); err != nil {
		return err
	}
	if !h.cfg.NoJournal {
		h.pub.useJournal(j)
	}
	journalDone := make(chan struct{})
	go func() { j.run(); close(journalDone) }()
	if err := h.resume(ctx, j, prev, prevNums); err != nil {
		j.close()
		<-journalDone
		return err
	}
	for _, r := range h.pids.reap() {
		h.log.Info("the restart reaped what a previous node left of an agent", "agent", r.agent, "pid", r.pid, "how", r.how)
	}
	if h.cfg.Reaper != "" {
		r, err := proc.StartReaper(h.cfg.Reaper)
		if err != nil {
			return fmt.Errorf("start the node's reaper: %w", err)
		}
		h.setReaper(r, "")
		keep, stopKeeping := context.WithCancel(context.WithoutCancel(ctx))
		kept := make(chan struct{})
		go func() { h.keepReaper(keep); close(kept) }()
		defer func() { // last: the reaper kills whatever the agents left
			stopKeeping()
			<-kept
			if r := h.currentReaper(); r != nil {
				r.Close()
			}
		}()
	} else {
		h.log.Warn("no reaper: an agent's processes that leave its process group may outlive it")
	}
	h.recs = newRecords(h.store, h.cfg.Name, h.log, h.abandon)

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	h.pub.onFull = func(full bool, spillErr error) { h.outboxFull(bg, full, spillErr) }
	lapses := make(chan struct{}, 1)
	h.pub.onLapse = func() {
		select {
		case lapses <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { h.pub.run(bg) })
	if err := h.reconcileRecords(ctx); err != nil {
		return err
	}
	wg.Go(func() { h.recs.run(bg) })
	wg.Go(func() { h.watch(bg) })

	// What the node can run is known before its endpoints answer (the
	// describe verb tells, an open updates the record).
	h.repos = newRepos(ctx, h)
	h.ads = newAdvertiser(ctx, h, ttl)
	wg.Go(func() { h.recheck(bg, lapses) })
	svc, err := h.serve(ctx)
	if err != nil {
		return err
	}
	// The endpoints' subscriptions reach the server before anyone is told
	// the node is ready.
	if err := h.cfg.Conn.FlushTimeout(10 * time.Second); err != nil {
		svc.Stop()
		return fmt.Errorf("register the %s service: %w", schemas.ServiceName, err)
	}
	// Advertised only once it answers, so placement never picks a node
	// that cannot take the request yet.
	if err := h.ads.write(ctx); err != nil {
		svc.Stop()
		return fmt.Errorf("advertise the node: %w", err)
	}
	wg.Go(func() { h.ads.run(bg) })
	close(h.ready)
	ready, notReady := readiness(h.ads.record().Backends)
	h.log.Info("node ready", "backends", strings.Join(ready, ","), "not_ready", strings.Join(notReady, "; "), "dir", h.cfg.Dir)
	if h.sandbox.kernel != "" && !h.sandbox.namespaces {
		h.log.Warn("sandboxed agents get Landlock and seccomp, without namespaces of their own", "why", h.sandbox.nsWhy)
	}
	<-ctx.Done()

	svc.Stop()
	if !h.cfg.Conn.IsConnected() {
		h.log.Warn("stopping while the fabric is away: the agents' last records and events wait up to 30s for it; the journal keeps what is not stored, and the next start settles the rest", "pending", h.pub.pending())
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer h.requests.Wait()
	defer cancel()
	h.closeAll(shutdown)
	h.agentWork.Wait()
	for _, b := range h.cfg.Backends {
		if c, ok := b.(io.Closer); ok {
			if err := c.Close(); err != nil {
				h.log.Warn("closing a backend", "kind", b.Kind(), "err", err)
			}
		}
	}
	if err := h.pub.flush(shutdown); err != nil {
		h.log.Warn("some events were not stored before the node stopped; the journal keeps them for the next start", "pending", h.pub.pending())
	} else if err := h.nums.clear(); err != nil {
		h.log.Warn("cannot clear the numbers file", "err", err)
	}
	defer func() { j.close(); <-journalDone }()
	h.recs.flush(shutdown)
	h.ads.leave(shutdown)
	stopBG()
	wg.Wait()
	return nil
}

// join opens the fabric's stream and buckets (a confined node: its
// relay) and says hello, which checks that the node's name is free. It
// waits, saying so, while they are not there yet: a coordinator started
// with its nodes (a service manager, compose) that has not made them on
// its NATS deployment, a relay not yet answering, a cluster electing the
// stream's leader. Any other failure ends it.
func (h *Host) join(ctx context.Context) (schemas.RelayHelloReply, error) {
	for wait := time.Second; ; wait = min(2*wait, 10*time.Second) {
		hello, err := h.openStore(ctx)
		if err == nil || !notThereYet(err) || ctx.Err() != nil {
			return hello, err
		}
		h.log.Warn("waiting for the coordinator (shoal up) to make the fabric's stream and buckets, or to answer", "err", err)
		select {
		case <-ctx.Done():
			return hello, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (h *Host) openStore(ctx context.Context) (schemas.RelayHelloReply, error) {
	if h.cfg.Confined {
		h.store = &relayStore{nc: h.cfg.Conn, node: h.cfg.Name}
	} else {
		s, err := newDirectStore(ctx, h.cfg.Conn, h.js, h.cfg.Name)
		if err != nil {
			return schemas.RelayHelloReply{}, err
		}
		h.store = s
	}
	hello, err := h.store.hello(ctx)
	if err != nil {
		return hello, fmt.Errorf("check that the name %s is free: %w", h.cfg.Name, err)
	}
	return hello, nil
}

// notThereYet reports whether err, from opening the fabric's store, is
// one a wait ends: the stream or a bucket not made yet, JetStream or the
// relay not answering in time, a cluster without a leader for a moment.
func notThereYet(err error) bool {
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		schemas.CodeOf(err) == schemas.CodeUnavailable {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 503 // JetStream temporarily unavailable
}

// eventSender is how the node's events reach the stream: in fast
// batches where the stream takes them and the node reaches JetStream
// itself, else (a confined node, whose relay stores each event, or an
// older server) with an asynchronous publish per event.
func (h *Host) eventSender(ctx context.Context, events *nats.Conn, js jetstream.JetStream) (sender, error) {
	if h.cfg.Confined || h.cfg.NoBatches {
		return asyncSender{js}, nil
	}
	stream, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	if !allowsBatches(stream.CachedInfo()) {
		h.log.Info("the stream takes no fast batches (nats-server 2.14 and later, allow_batched); events are published one by one")
		return asyncSender{js}, nil
	}
	h.log.Info("events are published in fast batches")
	return newBatchSender(events, h.cfg.PublishWindow, publishAckWait)
}

// publishAckWait is how long an event may wait for the stream's
// acknowledgement before it counts as lost. It is shorter than a NATS
// cluster takes to elect a new stream leader after losing one (4 to 9
// seconds by default), so the publisher stops at a lost event before a
// new leader could store the events sent after it.
const publishAckWait = 2 * time.Second

// eventConn returns a connection for events that buffers nothing while
// reconnecting: nc itself when it is one, else a second connection with
// nc's options but that.
func eventConn(nc *nats.Conn) (ec *nats.Conn, close func(), err error) {
	if nc.Opts.ReconnectBufSize < 0 {
		return nc, func() {}, nil
	}
	opts := nc.Opts
	opts.ReconnectBufSize = -1
	if opts.Name != "" {
		opts.Name += " (events)"
	}
	if ec, err = opts.Connect(); err != nil {
		return nil, nil, fmt.Errorf("open the node's event connection: %w", err)
	}
	return ec, ec.Close, nil
}

func (h *Host) kinds() []string {
	var ks []string
	for k := range h.backends {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// reconcileRecords closes what a previous run of this node left open:
// the agents its records still call alive did not survive the restart.
// Each record is marked dead (so none is silently resurrected), and the
// agent's stream gets the closing events a lost node's agents get from
// the coordinator, which never sees a node that restarts within its
// heartbeat's lifetime as lost. As with the coordinator, whoever marks
// the record dead closes the stream. It waits, within limits, for those
// events to be stored, so an id reopened right away numbers its events
// after them. It fails when the node's records cannot be listed whole.
func (h *Host) reconcileRecords(ctx context.Context) error {
	// The publisher, held since the start, goes once the lives another
	// closed are dropped, before the closings written here are waited on.
	release := sync.OnceFunc(func() { h.pub.resume(time.Time{}) })
	defer release()
	drop := func(id, why string) {
		if t, ok := h.pub.pendingTail(id); ok {
			h.log.Warn(why+"; what the journal kept of it is dropped", "agent", id, "to", t.Last)
			h.pub.drop(id, t.Last)
		}
	}
	// Permission requests a previous run left open end denied, in the
	// fabric's list and on their agents' streams.
	left := map[string][]schemas.PermitRecord{}
	for _, rec := range h.permits.leftOver() {
		why := fmt.Sprintf("node %s restarted before anyone answered", h.cfg.Name)
		rec.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionDeny, Message: why, By: "node restarted", At: unixTime(time.Now())}
		h.putPermit(ctx, schemas.Answered(rec, *rec.Answer))
		left[rec.AgentID] = append(left[rec.AgentID], rec)
	}
	// Listed whole, or the node does not start: what its journal holds
	// of an agent whose record it could not read may be another's.
	var owned []entry
	var err error
	for wait := 500 * time.Millisecond; ; wait *= 2 {
		if owned, err = h.store.owned(ctx); err == nil {
			break
		}
		if wait > 8*time.Second {
			return fmt.Errorf("list this node's agent records: %w", err)
		}
		h.log.Warn("cannot list this node's agent records; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	type orphan struct {
		e   entry
		rec schemas.AgentRecord
	}
	var orphans []orphan
	var ids []string
	for _, e := range owned {
		rec, err := decodeRecord(e.value)
		if err == nil && rec.Node == h.cfg.Name && rec.Status == schemas.StatusDead && rec.ClosedBy != "" {
			drop(e.id, "the fabric took this agent for lost and closed it while the node was away")
		}
		if err != nil || rec.Node != h.cfg.Name || rec.Status == schemas.StatusDead {
			continue
		}
		orphans = append(orphans, orphan{e, rec})
		ids = append(ids, e.id)
	}
	defer h.trimDead(ctx, owned)
	if len(orphans) == 0 {
		return nil
	}
	tails, err := h.tails(ctx, ids)
	if err != nil {
		h.log.Warn("cannot read the streams of agents a previous run left open; they are marked dead without closing events", "err", err)
	}
	wait := map[string]uint64{}
	now := time.Now()
	for _, o := range orphans {
		// Marking the record dead first decides who closes the stream: a
		// coordinator that judged this node lost meanwhile has written
		// it, and closed the stream itself.
		tail, ok := tails[o.e.id]
		// What the record numbered and the stream does not hold, this
		// node's journal holds, and sends: the close numbers after it
		// (a closer without the journal numbers from the stream, where
		// retention dropped nothing of the life).
		tail.Journaled = true
		tail, seq := tail.ClosingFrom(o.rec)
		var closing []schemas.Event
		if ok {
			for _, p := range left[o.e.id] {
				// The request was the running turn's: a held turn after it is
				// numbered in the record, not begun.
				closing = append(closing, schemas.Event{Turn: max(o.rec.Turn-o.rec.Held, 0), Payload: schemas.ErrorWith(
					fmt.Sprintf("permission request %s (%s) was denied: %s", p.RequestID, p.Tool, p.Answer.Message),
					map[string]string{"requestId": p.RequestID, "toolCallId": p.ToolCallID})})
			}
			closing = append(closing, tail.Closing(o.rec, "node "+h.cfg.Name+" restarted")...)
		}
		h.countJournaled(&o.rec)
		dead := o.rec.Dead()
		if ok {
			dead.LastEvent, dead.Turn = seq+uint64(len(closing)), max(dead.Turn, tail.Turn)
		}
		if _, err := h.store.update(ctx, o.e.id, encodeRecord(dead), o.e.rev); err != nil {
			h.log.Warn("cannot mark a lost agent dead; leaving its stream to whoever did", "agent", o.e.id, "err", err)
			drop(o.e.id, "another wrote this agent's record first")
			continue
		}
		if ok {
			for _, ev := range closing {
				wire, err := schemas.Encode(ev)
				if err != nil {
					h.log.Error("cannot encode a closing event", "agent", o.e.id, "err", err)
					break
				}
				seq++
				h.enqueue(o.e.id, seq, wire, now)
			}
			if seq > tail.Last {
				wait[o.e.id] = seq
			}
		}
		h.log.Info("closed an agent a previous run of this node left open", "agent", o.e.id)
	}
	release()
	stored, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for id, seq := range wait {
		if err := h.pub.waitStored(stored, id, seq); err != nil {
			h.log.Warn("the closing events of an agent a previous run left open are not stored yet", "agent", id, "err", err)
			continue
		}
		// Its last number, exactly: the block reserved for the closing
		// events was not used, and a journal lost later must not say so.
		if err := h.nums.settle(id, seq); err != nil {
			h.log.Warn("cannot write the numbers file", "err", err)
		}
	}
	return nil
}

// trimDead forgets the oldest of the dead agents earlier runs of the node
// left in owned beyond MaxDead, as retire does for this run's: without
// it, each restart left up to MaxDead more (and every agent alive at a
// crash) in every list for good. A record whose id has a budget of its
// own stays, as in retire.
func (h *Host) trimDead(ctx context.Context, owned []entry) {
	type dead struct {
		e    entry
		last float64
	}
	var all []dead
	for _, e := range owned {
		rec, err := decodeRecord(e.value)
		if err == nil && rec.Node == h.cfg.Name && rec.Status == schemas.StatusDead {
			all = append(all, dead{e, rec.LastActivity})
		}
	}
	over := len(all) - h.cfg.MaxDead
	if over <= 0 {
		return
	}
	slices.SortFunc(all, func(x, y dead) int { return cmp.Compare(x.last, y.last) })
	forgotten := 0
	for _, d := range all[:over] {
		actx, cancel := context.WithTimeout(ctx, budgetRead)
		allow, err := h.store.allowance(actx, d.e.id, h.instance(), h.labels)
		if err == nil && allow.Agent.IsZero() {
			err = h.store.remove(actx, d.e.id, d.e.rev)
		}
		cancel()
		if err != nil || !allow.Agent.IsZero() {
			continue
		}
		forgotten++
		h.removeFiles(d.e.id)
		if _, waiting := h.pub.pendingTail(d.e.id); !waiting {
			if err := h.nums.forget(d.e.id); err != nil {
				h.log.Warn("cannot write the numbers file", "err", err)
			}
		}
	}
	if forgotten > 0 {
		h.log.Info("forgot dead agents earlier runs left beyond the ones kept", "forgotten", forgotten, "kept", h.cfg.MaxDead)
	}
}

// removeFiles removes what the node keeps in its directory for an agent
// it forgets that holds a secret: the MCP configurations it wrote (which
// hold the agent's token) and a sandboxed agent's own homes (a copy of
// the CLI's login among them). A dead id opened again makes them afresh.
// Its event log stays, as Kaimon keeps a reaped agent's (agent_output
// reads it there), and its stderr beside it.
func (h *Host) removeFiles(id string) {
	for _, name := range []string{id + "-mcp.json", id + "-caller-mcp.json"} {
		if err := os.Remove(filepath.Join(h.cfg.Dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			h.log.Warn("cannot remove a forgotten agent's file", "agent", id, "err", err)
		}
	}
	for _, home := range []string{"claude-" + id, "gemini-" + id, "acp-" + id} {
		if err := os.RemoveAll(filepath.Join(h.cfg.Dir, home)); err != nil {
			h.log.Warn("cannot remove a forgotten agent's directory", "agent", id, "err", err)
		}
	}
}

// closeAll closes every live agent.
func (h *Host) closeAll(ctx context.Context) {
	h.mu.Lock()
	var live []*agent
	for _, a := range h.agents {
		if !a.isDead() {
			live = append(live, a)
		}
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range live {
		wg.Go(func() { a.close(ctx) })
	}
	wg.Wait()
}

// retire is called by an agent's loop once it is dead: it leaves the
// pid file, and the oldest dead agents beyond MaxDead are forgotten.
func (h *Host) retire(ctx context.Context, a *agent) {
	h.permits.forget(a.id)
	// The reaper ends what an agent's CLI leaves when it exits; where
	// there is none, or it died (taking the CLI with it), the processes
	// that carry the agent's life token are ended here, before its entry
	// that would let a restarted node find them is gone.
	if life := h.pids.remove(a.id); life != "" && !a.heldByLiveReaper() {
		if n := proc.ReapLife(life); n > 0 {
			a.log.Info("ended what the agent left running", "processes", n)
		}
	}
	a.ended()
	// A dead agent numbers nothing more: its mark is its last number, so a
	// journal lost later is told exactly.
	if err := h.nums.settle(a.id, a.lastSeq()); err != nil {
		h.log.Warn("cannot write the numbers file", "err", err)
	}
	h.ads.poke()
	h.mu.Lock()
	var dead []*agent
	for _, x := range h.agents {
		if x.isDead() {
			dead = append(dead, x)
		}
	}
	var drop []*agent
	if over := len(dead) - h.cfg.MaxDead; over > 0 {
		slices.SortFunc(dead, func(x, y *agent) int { return x.lastActivityTime().Compare(y.lastActivityTime()) })
		drop = dead[:over]
		for _, x := range drop {
			delete(h.agents, x.id)
		}
	}
	h.mu.Unlock()
	for _, x := range drop {
		// The record of an id with a budget of its own is kept: its
		// usage_before is what holds the id's next life to the budget,
		// which covers every life. (A budget that cannot be read keeps
		// it too.)
		actx, cancel := context.WithTimeout(ctx, budgetRead)
		allow, err := h.store.allowance(actx, x.id, h.instance(), h.labels)
		cancel()
		h.recs.forget(ctx, x, err != nil || !allow.Agent.IsZero())
		h.pub.forget(x.id)
		h.mu.Lock()
		_, again := h.agents[x.id] // opened again meanwhile: the files are its new life's
		h.mu.Unlock()
		if !again {
			h.removeFiles(x.id)
		}
		// Its mark is needed only while its events may be lost with the
		// journal: once none waits, the numbers file forgets it, so the
		// file holds the agents the node keeps, not every agent it ran.
		if _, waiting := h.pub.pendingTail(x.id); !waiting {
			if err := h.nums.forget(x.id); err != nil {
				h.log.Warn("cannot write the numbers file", "err", err)
			}
		}
	}
}

// watch runs the per-turn watchdogs.
func (h *Host) watch(ctx context.Context) {
	tick := time.Second
	for _, d := range []time.Duration{h.cfg.TurnIdleTimeout, h.cfg.TurnTimeout} {
		if d > 0 {
			tick = min(tick, max(d/10, 10*time.Millisecond))
		}
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.mu.Lock()
			agents := make([]*agent, 0, len(h.agents))
			for _, a := range h.agents {
				agents = append(agents, a)
			}
			h.mu.Unlock()
			for _, a := range agents {
				if turn, why := a.due(now, h.cfg.TurnIdleTimeout, h.cfg.TurnTimeout); why != "" {
					a.work.Go(func() { a.fire(ctx, turn, why) })
				}
			}
		}
	}
}

// serve registers the node's micro service; its requests run in ctx, on
// goroutines h.requests waits for.
func (h *Host) serve(ctx context.Context) (micro.Service, error) {
	svc, err := micro.AddService(h.cfg.Conn, micro.Config{
		Name:        schemas.ServiceName,
		Version:     h.cfg.Version,
		Description: "Shoal agent host " + h.cfg.Name,
		Metadata:    h.metadata(),
	})
	if err != nil {
		return nil, fmt.Errorf("register the %s service: %w", schemas.ServiceName, err)
	}
	g := svc.AddGroup(schemas.NodeGroup(h.cfg.Name), micro.WithGroupQueueGroupDisabled())
	h.requests = service.NewServer(ctx, h.cfg.Metrics, h.cfg.Conn.MaxPayload())
	for _, e := range h.endpoints(h.requests) {
		if err := g.AddEndpoint(string(e.verb), e.handler, micro.WithEndpointQueueGroupDisabled()); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("add endpoint %s: %w", e.verb, err)
		}
	}
	return svc, nil
}

// recheck answers each lapse of the node's lease (its heartbeat unwritten
// for its TTL: the node was cut off, or stopped, or its machine slept):
// the coordinator may have taken it for lost meanwhile and closed its
// agents' streams. Before the publisher sends another event, the node
// beats again and writes each of its agents' records again
// (records.reassert); the agents the fabric took for lost are stopped,
// and their events not yet stored dropped.
func (h *Host) recheck(ctx context.Context, lapses <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-lapses:
		}
		h.log.Warn("the node's heartbeat went unwritten for its TTL; it asks whether its agents are still its own before it sends more events")
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
			// The beat first: a coordinator that has not yet written an
			// agent dead then finds the node back (coordinator.closeLost).
			began := time.Now()
			err := h.ads.write(ctx)
			var lost []*agent
			if err == nil {
				lost, err = h.recs.reassert(ctx)
			}
			if err == nil {
				for _, a := range lost {
					h.pub.drop(a.id, a.mute())
				}
				h.pub.resume(h.ads.leaseFrom(began))
				h.log.Info("the node's agents checked; sending events again", "taken_for_lost", len(lost))
				break
			}
			if backoff == 100*time.Millisecond {
				h.log.Warn("cannot check the node's agents yet; their events wait", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
	}
}

// takenOver stops the node: another life of its name (other) started
// while this one was away past its TTL. Its agents, which the fabric
// closed when it took this node for lost, are stopped without another
// word to the fabric (records under the name are the other life's to
// write now), its entry is left to the other, and the node exits.
func (h *Host) takenOver(ctx context.Context, other string) {
	h.log.Error("another node took this node's name while it was away; this node stops its agents, which the fabric closed, and exits", "other_instance", other)
	h.mu.Lock()
	ids := make([]string, 0, len(h.agents))
	for id := range h.agents {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.recs.takenForLost(context.WithoutCancel(ctx), id, h.cfg.Name)
	}
	h.stopSelf(fmt.Errorf("%w (its life %s): this node stopped; start it again under another name (shoal node --node-name NAME), or stop the other", errNameTaken, other))
}

// abandon stops an agent the fabric has declared dead while this node was
// cut off from it: the process goes, and nothing more is published for it,
// since its stream was closed without it.
func (h *Host) abandon(ctx context.Context, id string) {
	h.mu.Lock()
	a := h.agents[id]
	h.mu.Unlock()
	if a == nil || a.isDead() {
		return
	}
	h.pub.drop(id, a.mute())
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a.close(ctx)
}

// metadata is what the node's micro service tells `nats micro info`: its
// name, what it could run when it started (runs) and why not the rest
// (not_ready), and its labels. The node's record (describe, shoal nodes)
// follows later changes; micro metadata is fixed for the service's life.
func (h *Host) metadata() map[string]string {
	ready, notReady := readiness(h.ads.record().Backends)
	md := map[string]string{"node": h.cfg.Name, "runs": strings.Join(ready, ","), "not_ready": strings.Join(notReady, "; ")}
	var labels []string
	for k, v := range h.cfg.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	md["labels"] = strings.Join(labels, ",")
	if h.cfg.MaxAgents > 0 {
		md["max_agents"] = strconv.Itoa(h.cfg.MaxAgents)
	}
	return md
}

// outboxFull acts when the outbox fills (the fabric has been away long
// enough, or the disk took no more of it: spillErr): running turns are
// interrupted, so agents stop producing what cannot be kept. Once it
// drains, each of those agents says on its stream what happened.
func (h *Host) outboxFull(ctx context.Context, full bool, spillErr error) {
	h.mu.Lock()
	agents := make([]*agent, 0, len(h.agents))
	for _, a := range h.agents {
		agents = append(agents, a)
	}
	h.mu.Unlock()
	if full {
		if spillErr != nil {
			h.log.Error("the outbox is full: the fabric is unreachable and the node's disk takes no more of it; interrupting running turns",
				"memory", h.cfg.OutboxMemory, "disk", h.cfg.OutboxDisk, "err", spillErr)
		} else {
			h.log.Error("the outbox is full: the fabric has been unreachable too long; interrupting running turns",
				"memory", h.cfg.OutboxMemory, "disk", h.cfg.OutboxDisk)
		}
		for _, a := range agents {
			if a.outboxFilled() {
				a.work.Go(func() { a.interrupt(ctx) })
			}
		}
		return
	}
	for _, a := range agents {
		turn, dropped := a.outboxDrained()
		if turn == 0 && dropped == 0 {
			continue
		}
		msg := fmt.Sprintf("the fabric was unreachable until the node's outbox filled (%s in memory", bytesText(int64(h.cfg.OutboxMemory)))
		switch {
		case spillErr != nil:
			msg = fmt.Sprintf("the fabric was unreachable and the node's disk took no more of its outbox (%v), so the outbox filled (%s in memory)", spillErr, bytesText(int64(h.cfg.OutboxMemory)))
		case h.cfg.OutboxDisk > 0:
			msg += fmt.Sprintf(", %s on disk)", bytesText(h.cfg.OutboxDisk))
		default:
			msg += ")"
		}
		if turn > 0 {
			msg += fmt.Sprintf("; turn %d was interrupted", turn)
		}
		if dropped > 0 {
			msg += fmt.Sprintf("; %d streamed chunks were not kept (the complete copies were)", dropped)
		}
		a.emit(a.currentTurn(), schemas.Errorf("%s", msg))
	}
}

// bytesText writes a size the way people read it: 48 KiB, 64 MiB, 1 GiB.
func bytesText(n int64) string {
	for _, u := range []struct {
		unit string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', -1, 64) + " " + u.unit
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// setReaper makes r the node's reaper; why, when not empty, says the node
// cannot start agents until it has one again.
func (h *Host) setReaper(r *proc.Reaper, why string) {
	h.reaperMu.Lock()
	h.reaper, h.unhealthy = r, why
	h.reaperMu.Unlock()
	if h.ads != nil {
		h.ads.poke()
	}
}

func (h *Host) currentReaper() *proc.Reaper {
	h.reaperMu.Lock()
	defer h.reaperMu.Unlock()
	return h.reaper
}

// health says why the node cannot start agents now, "" when it can.
func (h *Host) health() string {
	h.reaperMu.Lock()
	defer h.reaperMu.Unlock()
	return h.unhealthy
}

// keepReaper starts another reaper whenever the node's dies (killed: the
// agents it held died with it, and the node's own ends close them). Until
// one runs the node's record says it cannot start agents, and opens are
// refused, so placement passes it over.
func (h *Host) keepReaper(ctx context.Context) {
	wait := 100 * time.Millisecond
	for {
		r := h.currentReaper()
		select {
		case <-ctx.Done():
			return
		case <-r.Done():
		}
		h.log.Error("the node's reaper died; starting another", "pid", r.PID())
		h.setReaper(r, fmt.Sprintf("its reaper (pid %d) died and another is starting", r.PID()))
		for {
			next, err := proc.StartReaper(h.cfg.Reaper)
			if err == nil {
				h.setReaper(next, "")
				h.log.Info("the node has a reaper again", "pid", next.PID())
				wait = 100 * time.Millisecond
				break
			}
			h.log.Error("cannot start a reaper; the node starts no agent until it can", "err", err)
			h.setReaper(r, fmt.Sprintf("its reaper died and another cannot start: %v", err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 5*time.Second)
		}
	}
}

// heldByLiveReaper reports whether a reaper that is still running holds
// the agent's processes (and so ends what they leave).
func (a *agent) heldByLiveReaper() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reaper != nil && !a.reaper.Gone()
}
