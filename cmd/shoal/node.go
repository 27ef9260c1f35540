package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/metrics"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// nodeOptions are the settings of an agent host, shared by `shoal node`
// and the local node of `shoal up`.
type nodeOptions struct {
	// unreadable are paths of the process that runs the node (shoal up's
	// store, its signing keys, its TLS key) kept from sandboxed agents, as
	// the node's own credentials are.
	unreadable []string

	name        string
	instance    string // this life's (life); made at its first use
	dir         string
	claude      string
	acpCommands map[string]*string
	mcpURL      string
	// mcpToken is the endpoint's token; the node holds only its key
	// (schemas.NodeKey) from it.
	mcpToken       string
	turnIdle       time.Duration
	turnTimeout    time.Duration
	interruptGrace time.Duration
	imageEdge      int
	stopWait       time.Duration
	labels         string
	maxAgents      int
	outboxMemory   int64
	outboxDisk     int64
	refresh        time.Duration
	keepFor        time.Duration
	sandbox        string
	sandboxKind    string
	publish        string
	// metrics receives the node's metrics, when the command serves them.
	metrics *metrics.Registry
}

func (o *nodeOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.name, "node-name", "", "the node's `name` in the fabric (default: this machine's host name)")
	fs.StringVar(&o.dir, "dir", "", "`directory` for agent event logs, stderr logs and pids.json (default: $XDG_CACHE_HOME/shoal/agents/<name>)")
	fs.StringVar(&o.claude, "claude", "claude", "the claude CLI to run, a `path` or a name looked up on PATH")
	o.acpCommands = map[string]*string{}
	for _, a := range []struct{ agent, flag string }{{acp.AgentOpencode, "opencode"}, {acp.AgentClaude, "claude-agent-acp"}, {acp.AgentGemini, "gemini"}} {
		o.acpCommands[a.agent] = fs.String(a.flag, acp.DefaultCommands[a.agent][0], "the command that runs acp:"+a.agent+" agents, a `path` or a name looked up on PATH")
	}
	fs.StringVar(&o.mcpURL, "mcp-url", "", "the coordinator's MCP endpoint `URL` agents are pointed at (default: shoal up's own endpoint; for shoal node, the one the coordinator names to a node with credentials, else none)")
	durationFlag(fs, &o.turnIdle, "turn-idle-timeout", 10*time.Minute, "interrupt a turn that produced no output for this `duration` (0: never)")
	durationFlag(fs, &o.turnTimeout, "turn-timeout", 2*time.Hour, "interrupt a turn that ran this `duration` (0: never)")
	durationFlag(fs, &o.interruptGrace, "interrupt-grace", 15*time.Second, "stop an agent whose turn has not ended this `duration` after a watchdog interrupt")
	fs.IntVar(&o.imageEdge, imageEdgeFlag, 1568, "downsample tool-result PNGs to this long edge in `pixels`, 0 for never (default: "+kaimonKey+" in Kaimon's config.json if it is there, else 1568)")
	durationFlag(fs, &o.stopWait, "stop-wait", 2*time.Second, "how long each step of an agent's stop ladder waits, a `duration`")
	fs.StringVar(&o.labels, "labels", "", "comma-separated `key=value` labels placement can ask for (e.g. gpu=yes,site=lab)")
	fs.IntVar(&o.maxAgents, "max-agents", 0, "run at most `n` live agents (0: no limit)")
	sizeFlag(fs, &o.outboxMemory, "outbox-memory", 64<<20, "events kept in memory while the coordinator is away, in `bytes`")
	sizeFlag(fs, &o.outboxDisk, "outbox-disk", 1<<30, "events kept on disk after that, in `bytes` (0: none)")
	fs.StringVar(&o.sandbox, "sandbox", schemas.SandboxOff, "sandbox `mode`: off (agents run confined only when their open asks), on (every agent, unless its open declines), required (every agent)")
	fs.StringVar(&o.sandboxKind, "sandbox-kind", schemas.SandboxNamespaces, "the strongest `kind` of sandbox this node gives: namespaces (of their own around Landlock and seccomp, where this machine allows them) or landlock (Landlock and seccomp alone)")
	fs.StringVar(&o.publish, "publish", "batches", "how the node publishes its events: `way` batches (JetStream fast batches, where the stream allows them) or async (an asynchronous publish per event)")
	durationFlag(fs, &o.keepFor, "keep-for", node.DefaultKeepFor, "keep an ended agent's checkout of a repository this `duration` (for shoal diff, fetch and a reopen); 0: until removed by hand")
	durationFlag(fs, &o.refresh, "refresh", time.Minute, "detect again what this node can run (CLIs, model servers and their models) every `duration`")
}

// parseLabels reads k=v,k=v.
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usagef("label %q is not key=value", kv)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := schemas.ValidNodeLabels(out); err != nil {
		return nil, usagef("--labels: %v", err)
	}
	return out, nil
}

// hostName derives a node name from the machine's host name.
func hostName() string {
	h, _ := os.Hostname()
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-_")
	if len(name) > 64 {
		name = name[:64]
	}
	if name == "" {
		name = "node"
	}
	return name
}

// nodeName is --node-name, or the machine's host name.
func (o *nodeOptions) nodeName() string {
	if o.name != "" {
		return o.name
	}
	return hostName()
}

// life is this process's life instance of the node, which its
// connections' names and its record carry (schemas.NodeConnName).
func (o *nodeOptions) life() string {
	if o.instance == "" {
		o.instance = schemas.NewInstance()
	}
	return o.instance
}

// connName is the name of the node's connections in this life.
func (o *nodeOptions) connName() string { return schemas.NodeConnName(o.nodeName(), o.life()) }

// checkName says, before anything connects, why the node's name cannot
// be a node's.
func (o *nodeOptions) checkName() error {
	if err := schemas.ValidNodeName(o.nodeName()); err != nil {
		if o.name == "" {
			return usagef("this machine's host name cannot name its node: %v; give --node-name", err)
		}
		return usagef("--node-name: %v", err)
	}
	return nil
}

// secrets are the paths no sandboxed agent of the node may read: its
// credentials and TLS key, the home directory, Shoal's data and
// configuration directories, and what else the process keeps
// (unreadable).
func (o *nodeOptions) secrets(env *environment) []string {
	out := []string{home(env.getenv), filepath.Join(dataHome(env.getenv), "shoal"), filepath.Join(configHome(env.getenv), "shoal")}
	out = append(out, o.unreadable...)
	for i, p := range out {
		if p != "" {
			if abs, err := filepath.Abs(p); err == nil {
				out[i] = abs
			}
		}
	}
	return out
}

// host builds the node on nc. A confined node reaches the fabric's state
// only through the coordinator's relay, as node credentials require.
func (o *nodeOptions) host(env *environment, nc *nats.Conn, confined bool, log *slog.Logger) (*node.Host, error) {
	name := o.nodeName()
	dir := o.dir
	if dir == "" {
		dir = filepath.Join(cacheHome(env.getenv), "shoal", "agents", name)
	}
	commands := map[string][]string{}
	for agent, c := range o.acpCommands {
		cmd := slices.Clone(acp.DefaultCommands[agent])
		cmd[0] = *c
		commands[agent] = cmd
	}
	// This binary holds the agents' processes: the node's reaper on Linux,
	// a keeper per agent on macOS.
	reaper, err := os.Executable()
	if err != nil {
		log.Warn("cannot find this binary to hold agents with; an agent's processes that leave its process group may outlive it", "err", err)
		reaper = ""
	}
	// A claude CLI missing now is looked for again at every refresh, so
	// one installed later is found without a restart.
	path, err := exec.LookPath(o.claude)
	if err != nil {
		log.Warn("claude CLI not found; this node cannot run claude agents until it is installed (or give --claude PATH)", "looked-for", o.claude)
		path = o.claude
	}
	backends := []backend.Backend{claude.New(claude.Config{Path: path, Env: proc.NodeEnviron(), StopWait: o.stopWait})}
	backends = append(backends, acp.New(acp.Config{Commands: commands, Env: proc.NodeEnviron(), StopWait: o.stopWait}))
	// Local models: the servers at OLLAMA_HOST and VMLX_HOST (or their
	// defaults on loopback), each advertised with its models when it
	// answers.
	for _, l := range []struct{ kind, host string }{
		{backend.BackendOllama, local.OllamaHost(env.getenv("OLLAMA_HOST"))},
		{backend.BackendVMLX, local.VMLXHost(env.getenv("VMLX_HOST"))},
	} {
		b, err := local.New(local.Config{Kind: l.kind, Host: l.host})
		if err != nil {
			return nil, err
		}
		backends = append(backends, b)
	}
	labels, err := parseLabels(o.labels)
	if err != nil {
		return nil, err
	}
	if o.refresh <= 0 {
		return nil, usagef("--refresh %s is not a positive duration", o.refresh)
	}
	if o.keepFor < 0 {
		return nil, usagef("--keep-for %s is negative (0 keeps checkouts until removed by hand)", o.keepFor)
	}
	keep := o.keepFor
	if keep == 0 {
		keep = -1 // the node's "forever"
	}
	if o.maxAgents < 0 {
		return nil, usagef("--max-agents %d is negative", o.maxAgents)
	}
	if o.publish != "batches" && o.publish != "async" {
		return nil, usagef("--publish %q: batches or async", o.publish)
	}
	if o.outboxMemory < 1<<20 {
		return nil, usagef("--outbox-memory %s is too small (at least 1MiB)", sizeValue{&o.outboxMemory})
	}
	var counts node.Metrics
	var nm *metrics.Node
	if o.metrics != nil {
		nm = o.metrics.Node(name)
		counts = nm
	}
	h, err := node.New(node.Config{
		Instance:         o.life(),
		Labels:           labels,
		MaxAgents:        o.maxAgents,
		OutboxMemory:     int(o.outboxMemory),
		OutboxDisk:       negativeIfZero(o.outboxDisk),
		NoBatches:        o.publish == "async",
		RefreshInterval:  o.refresh,
		KeepFor:          keep,
		Name:             name,
		Conn:             nc,
		Dir:              dir,
		Backends:         backends,
		MCP:              backend.MCPEndpoint{URL: o.mcpURL, Token: schemas.NodeKey(o.mcpToken, name)},
		TurnIdleTimeout:  negativeIfZero(o.turnIdle),
		TurnTimeout:      negativeIfZero(o.turnTimeout),
		InterruptGrace:   o.interruptGrace,
		ImageMaxLongEdge: int(negativeIfZero(int64(o.imageEdge))),
		Version:          semver(),
		Confined:         confined,
		Reaper:           reaper,
		Unreadable:       o.secrets(env),
		Sandbox:          o.sandbox,
		SandboxKind:      o.sandboxKind,
		Logger:           log,
		Metrics:          counts,
	})
	if err != nil {
		return nil, usagef("%v", err)
	}
	if nm != nil {
		nm.Watch(h.AgentsByStatus, h.OutboxDepth)
	}
	return h, nil
}

// runHost runs h until ctx ends, returning once it is ready or failed.
func runHost(ctx context.Context, h *node.Host) (done <-chan error, err error) {
	errc := make(chan error, 1)
	go func() { errc <- h.Run(ctx) }()
	select {
	case <-h.Ready():
		return errc, nil
	case err := <-errc:
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
}

// nodeCommand is `shoal node`: an agent host joining a fabric.
type nodeCommandOptions struct {
	nodeOptions
	client      clientOptions
	leaf        string
	log         logOptions
	metricsAddr string
	// lost stops the node, saying why, when its connection cannot come
	// back (run sets it).
	lost func(error)
}

func nodeCommand() *command {
	return &command{
		name:    "node",
		summary: "run an agent host that joins a fabric",
		help: `
Runs an agent host on this machine and joins it to the fabric at --nats.
The node runs the agent CLIs it finds (claude), publishes every agent's
events on agent.<id>, and answers control requests as the NATS micro
service shoal-node. It keeps reconnecting while the coordinator is away.

A node started after a crash first kills any agent processes the crash
left behind (pids.json).

When the coordinator runs with --auth, the node needs credentials issued
for it on the coordinator (shoal creds node NAME > NAME.creds): they let it
answer only its own control subjects and publish events only for agents it
owns, through the coordinator. The node takes its name from them, and the
coordinator gives it the way to its MCP endpoint: each agent then reaches
Shoal's tools under a token of its own, with that agent's rights (give
--mcp-url when the coordinator's own address for it is not reachable from
this machine). A node without credentials is given the endpoint with
--mcp-url and --mcp-token.

A machine that can only dial out (behind NAT) joins as a leaf node with
--leaf nats-leaf://HUB:7422 instead of --nats: it runs a small embedded
NATS server that keeps one outbound connection to the coordinator's
leaf-node port (shoal up --leaf-listen).

--metrics serves the node's Prometheus metrics at /metrics.`,
		flags: func(fs *flag.FlagSet) runner {
			o := &nodeCommandOptions{}
			o.nodeOptions.register(fs)
			fs.StringVar(&o.name, "name", "", "old spelling of --node-name")
			fs.StringVar(&o.mcpToken, "mcp-token", "", "the coordinator's MCP endpoint `token`, for a node without credentials: the node derives each agent's own token from it (with --creds the coordinator gives the node a key of its own instead, and this is not needed)")
			o.client.registerConn(fs)
			fs.StringVar(&o.leaf, "leaf", "", "join as a leaf node: the coordinator's leaf-node `URL` (e.g. nats-leaf://hub:7422), instead of --nats")
			o.log.register(fs)
			fs.StringVar(&o.metricsAddr, "metrics", "", "serve the node's Prometheus metrics at /metrics on this `host:port`; a bare port listens on 127.0.0.1")
			return o.run
		},
	}
}

// connectPatiently dials the fabric, waiting for a coordinator that is not
// up yet; once connected, the connection keeps reconnecting by itself.
func (o *nodeCommandOptions) connectPatiently(ctx context.Context, env *environment, log *slog.Logger) (*nats.Conn, error) {
	for wait := time.Second; ; wait = min(2*wait, 10*time.Second) {
		// No reconnect buffer: while the coordinator is away the node's
		// outbox keeps events, in order, and publishes them once it is back.
		nc, err := o.client.connect(env, nats.Name(o.connName()), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.ReconnectBufSize(-1),
			// Said once each way: meanwhile what fails says only why it
			// could not send ("outbound buffer limit exceeded").
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil && ctx.Err() == nil { // stopping, its credentials gone, it does not connect again
					log.Warn("lost the fabric; connecting again (the agents go on, their events wait in the outbox)", "nats", o.client.url, "err", err)
				}
			}),
			nats.ReconnectHandler(func(*nats.Conn) { log.Info("connected to the fabric again", "nats", o.client.url) }),
			// It reconnects for ever, so a connection closed while the node
			// runs was closed for good: the server refused it twice (its
			// credentials) or ended it for a fault of the protocol. The
			// node, which can reach no one, stops.
			nats.ClosedHandler(func(nc *nats.Conn) {
				if ctx.Err() != nil || nc.LastError() == nil {
					return // the node closed it, stopping
				}
				why := o.client.credsGone(nc.LastError())
				if why == nil {
					why = schemas.Errf(schemas.CodeUnavailable, "NATS at %s closed the node's connection for good (%v): start the node again", o.client.url, nc.LastError())
				}
				o.lost(why)
			}))
		if err == nil {
			return nc, nil
		}
		if ctx.Err() != nil {
			return nil, &stoppedError{what: "stopped while it waited for the fabric"} // not the fabric's failure
		}
		if errors.As(err, new(refusedError)) || errors.As(err, new(*usageError)) {
			return nil, err
		}
		log.Warn("waiting for the fabric", "nats", o.client.url, "err", err)
		select {
		case <-ctx.Done():
			return nil, &stoppedError{what: "stopped while it waited for the fabric"}
		case <-time.After(wait):
		}
	}
}

func (o *nodeCommandOptions) run(ctx context.Context, env *environment, _ []string) error {
	if err := o.checkName(); err != nil {
		return err
	}
	dlog, err := o.log.open(env)
	if err != nil {
		return err
	}
	log := dlog.Logger
	if o.metricsAddr != "" {
		o.metrics = metrics.New()
		serve, err := serveMetricsOn(dlog.status, o.metrics, o.metricsAddr)
		if err != nil {
			return err
		}
		mctx, stopMetrics := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := serve(mctx); err != nil {
				log.Error("the metrics listener failed", "err", err)
			}
		}()
		defer func() { stopMetrics(); <-served }()
	}
	who, err := o.client.credentials()
	if err != nil {
		return err
	}
	if who != nil {
		switch {
		case who.Role != broker.RoleNode:
			return usagef("the credentials in %s are for %s %s, not a node: issue them with `shoal creds node NAME`", o.client.creds, who.Role, who.Name)
		case o.name != "" && o.name != who.Name:
			return usagef("the credentials in %s are for node %s, not %s", o.client.creds, who.Name, o.name)
		}
		o.name = who.Name
	}
	// The node stops, its agents with it, when its credentials are no
	// longer taken (they expired) or its connection is closed for good:
	// it cannot reach the fabric again, and says why as it exits.
	ctx, stopNode := context.WithCancelCause(ctx)
	defer stopNode(nil)
	var once sync.Once
	o.lost = func(err error) {
		once.Do(func() {
			log.Error("the node cannot reach the fabric again: it stops, and its agents", "err", err)
			stopNode(err)
		})
	}
	o.client.onCredsGone = o.lost
	var nc *nats.Conn
	var joined string
	if o.leaf != "" {
		leaf, err := o.joinAsLeaf(ctx, log)
		if err != nil {
			return err
		}
		defer leaf.Shutdown()
		opts := []nats.Option{nats.Name(o.connName()), nats.CustomInboxPrefix(schemas.InboxPrefix(string(broker.RoleNode), o.nodeName()))}
		if nc, err = leaf.Connect(opts...); err != nil {
			return err
		}
		joined = o.leaf + " (as a leaf node)"
	} else {
		if nc, err = o.connectPatiently(ctx, env, log); err != nil {
			return err
		}
		joined = nc.ConnectedUrlRedacted()
	}
	defer func() {
		stopNode(nil) // first: the node closes its connection, not the server
		nc.Close()
	}()
	o.unreadable = append(o.unreadable, o.client.creds, o.client.tls.key)
	h, err := o.host(env, nc, who != nil, log)
	if err != nil {
		return err
	}
	done, err := runHost(ctx, h)
	if err != nil {
		return err
	}
	dlog.status("node %s joined %s", h.Name(), joined)
	err = <-done
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// joinAsLeaf starts the embedded leaf server and waits, patiently, until
// its connection to the hub is up. Credentials the hub refuses end the
// wait at once.
func (o *nodeCommandOptions) joinAsLeaf(ctx context.Context, log *slog.Logger) (*broker.Leaf, error) {
	for wait := time.Second; ; wait = min(2*wait, 10*time.Second) {
		leaf, err := broker.NewLeaf(broker.LeafRemote{
			URL: o.leaf, Credentials: o.client.creds, Logger: log,
			TLS: broker.ClientTLS{CA: o.client.tls.ca, Cert: o.client.tls.cert, Key: o.client.tls.key},
		})
		if err != nil {
			return nil, usagef("--leaf: %v", err)
		}
		attempt, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = leaf.Start(attempt)
		cancel()
		if err == nil {
			return leaf, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if why := o.leafRefused(err); why != nil {
			return nil, why
		}
		log.Warn("waiting for the hub", "leaf", o.leaf, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// leafRefused says what a leaf join the hub refused lacks, as a dial's
// refusal says it (credentials, a certificate not trusted), or that
// --leaf names the hub's client port; nil for a failure a wait may end
// (a hub not reached). The last two were tried again for ever.
func (o *nodeCommandOptions) leafRefused(err error) error {
	if e := o.client.refusalAt(o.leaf, err); e != nil {
		return schemas.Errf(schemas.CodeInvalid, "%s", e)
	}
	if strings.Contains(err.Error(), "wrong port") {
		return schemas.Errf(schemas.CodeInvalid, "%s is the hub's port for clients, not for leaf nodes: give --leaf the address shoal up prints as \"leaf nodes connect to\" (its --leaf-listen)", o.leaf)
	}
	return nil
}

// listenAddr reads a listen address flag: host:port, or a bare port (or
// :port), which listens on 127.0.0.1.
func listenAddr(flag, s string) (string, int, error) {
	if !strings.Contains(s, ":") {
		s = ":" + s
	}
	host, port, err := hostPort(flag, s)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		host = broker.DefaultHost
	}
	return host, port, nil
}

// serveMetricsOn binds the metrics listener at addr (--metrics) and says
// where it is; the function it returns serves until its context ends.
func serveMetricsOn(say func(string, ...any), reg *metrics.Registry, addr string) (func(context.Context) error, error) {
	host, port, err := listenAddr("metrics", addr)
	if err != nil {
		return nil, err
	}
	url, serve, err := reg.Listen(net.JoinHostPort(host, strconv.Itoa(max(port, 0))))
	if err != nil {
		return nil, usagef("--metrics %s: %v", addr, err)
	}
	say("metrics %s", url)
	return serve, nil
}
