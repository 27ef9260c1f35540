package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/cmd/shoal/internal/metrics"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/schemas"
)

// upOptions are the settings of `shoal up`.
type upOptions struct {
	// disconnectNode closes a node's connections to the embedded server;
	// nil with an external one.
	disconnectNode func(node, instance string, before time.Time) int
	host           string
	port           int
	store          string
	maxPayload     int64
	memoryLimit    int64
	maxAge         time.Duration
	maxBytes       int64
	reposMaxBytes  int64
	duplicates     time.Duration
	nodeTTL        time.Duration
	replicas       int
	log            logOptions
	noNode         bool
	node           nodeOptions
	mcpListen      string
	mcpToken       string
	maxDepth       int
	mcpObserver    string
	publicURL      string
	noMCP          bool
	noWeb          bool
	bus            string
	noBus          bool
	auth           bool
	authDir        string
	tlsVerify      bool
	leafListen     string
	cluster        string
	clusterListen  string
	routes         string
	serverName     string
	monitor        string
	metrics        string
	// external: --nats, --creds and the client side of TLS, to use a NATS
	// deployment instead of the embedded server.
	external clientOptions
	// counts are the coordinator's metrics when --metrics is given.
	counts *metrics.Coordinator
	// fleet is the fleet's budget --budget-tokens and --budget-usd set at
	// start, when either is given.
	fleet schemas.BudgetRequest
}

// listenMetrics binds --metrics, if given, and returns what serves it;
// the local node's metrics go to the same registry.
func (o *upOptions) listenMetrics(say func(string, ...any)) (func(context.Context) error, error) {
	if o.metrics == "" {
		return nil, nil
	}
	reg := metrics.New()
	o.counts, o.node.metrics = reg.Coordinator(), reg
	return serveMetricsOn(say, reg, o.metrics)
}

func upCommand() *command {
	return &command{
		name:    "up",
		summary: "run the coordinator: embedded NATS with JetStream",
		help: `
Runs the coordinator on this machine: an embedded NATS server with
JetStream that keeps every agent event in the stream AGENTS and the agent
and node records in the KV buckets shoal_agents and shoal_nodes, the MCP
endpoint, the Kaimon bus, and a local node that runs agents here (unless
--no-node).

By default it listens on 127.0.0.1:4222 only and keeps its state under
$XDG_DATA_HOME/shoal (~/.local/share/shoal). It stops cleanly on Ctrl-C
or SIGTERM; a restart on the same store keeps every event.

Other machines: --auth turns on authentication (required to listen off
loopback); issue each node and client its credentials with shoal creds.
--tls-cert/--tls-key (and --tls-ca) encrypt client, leaf-node and cluster
connections. --leaf-listen accepts nodes behind NAT that dial out as leaf
nodes. --cluster with --routes joins two other coordinators in a 3-server
NATS cluster with replicated streams. --nats URL uses an existing NATS
deployment instead and embeds no server.

Monitoring: --monitor serves the NATS server's HTTP monitoring (/varz,
/connz, /jsz); with --auth, shoal creds system NAME issues a user of the
NATS system account for nats server info|list|report. --metrics serves
Prometheus metrics of the coordinator and its node at /metrics.`,
		flags: func(fs *flag.FlagSet) runner {
			o := &upOptions{}
			o.register(fs)
			return o.run
		},
	}
}

// defaultMemoryLimit is the coordinator's soft memory limit: an eighth of
// the machine's memory, at least 512 MiB and at most 640 MiB (512 MiB
// where the machine does not say). What the coordinator holds grows with
// the event rate (the stream's duplicate window keeps every event id it
// saw in that window, the file store caches what readers read), and under
// a sustained firehose the Go heap's slack doubles it; near the limit the
// runtime collects harder instead. A heap that needs more still gets it:
// the limit is soft. (Up to 2 GiB, the limit never acted on a machine of
// 16 GiB or more, and a default coordinator's peak through the firehose
// test rode the heap's slack: 539 to 766 MiB of the 768 MiB promised;
// with 640 MiB it is 638 to 647, no slower.)
func defaultMemoryLimit() int64 {
	const floor, ceiling = 512 << 20, 640 << 20
	return min(max(int64(node.MachineMemory()/8), floor), ceiling)
}

func (o *upOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.host, "host", broker.DefaultHost, "`address` NATS clients connect to; anything but loopback needs --auth")
	fs.IntVar(&o.port, "port", broker.DefaultPort, "`port` NATS clients connect to (-1 picks a free port)")
	fs.StringVar(&o.store, "store", "", "JetStream store `directory` (default: $XDG_DATA_HOME/shoal/jetstream)")
	sizeFlag(fs, &o.maxPayload, "max-payload", broker.DefaultMaxPayload, "largest `size` of a message the server accepts")
	sizeFlag(fs, &o.memoryLimit, "memory-limit", defaultMemoryLimit(), "soft limit on this process's memory, a `size` the Go runtime collects harder to stay under (default: an eighth of the machine's memory, 512MiB to 640MiB; 0: none; GOMEMLIMIT, when set, wins)")
	durationFlag(fs, &o.maxAge, "stream-max-age", broker.DefaultMaxAge, "drop events older than this `duration` (0: never)")
	sizeFlag(fs, &o.maxBytes, "stream-max-bytes", broker.DefaultMaxBytes, "drop the oldest events beyond this `size` (0: no limit)")
	sizeFlag(fs, &o.reposMaxBytes, "repos-max-bytes", broker.DefaultReposMaxBytes, "refuse repository bundles beyond this `size` in all (0: no limit)")
	durationFlag(fs, &o.duplicates, "stream-duplicates", broker.DefaultDuplicates, "`duration` in which a republished event is recognised and dropped")
	durationFlag(fs, &o.nodeTTL, "node-ttl", broker.DefaultNodeTTL, "a node whose heartbeat is older than this `duration` is lost")
	fs.IntVar(&o.replicas, "replicas", 0, "`copies` of the stream and buckets (default: 3 with --cluster, else 1)")
	o.log.register(fs)
	fs.BoolVar(&o.noNode, "no-node", false, "run no agents on this machine: only the broker")
	o.node.register(fs)
	fs.StringVar(&o.mcpListen, "mcp-listen", "127.0.0.1:7270", "`address` of the MCP endpoint (Streamable HTTP at /mcp)")
	fs.StringVar(&o.mcpToken, "mcp-token", "", "bearer `token` MCP clients must send to drive agents; required off loopback")
	fs.IntVar(&o.maxDepth, "max-depth", schemas.DefaultMaxDepth, "how deep agents may open agents through Shoal's tools, a `depth` (an agent's child is at depth 1; 0: not at all)")
	fs.StringVar(&o.mcpObserver, "mcp-observer-token", "", "bearer `token` that may only watch: "+strings.Join(schemas.ReadOnlyTools(), ", "))
	fs.StringVar(&o.publicURL, "public-url", "", "the `URL` browsers and MCP clients reach the endpoint at through a reverse proxy (e.g. https://shoal.example.com); needs a token")
	fs.BoolVar(&o.noMCP, "no-mcp", false, "serve no MCP endpoint (and so no web dashboard)")
	fs.BoolVar(&o.noWeb, "no-web", false, "serve no web dashboard at / beside the MCP endpoint")
	fs.StringVar(&o.bus, "bus", "", "Kaimon event bus `address` (default: ipc://$XDG_CACHE_HOME/kaimon/sock/kaimon-events.sock); tcp:// off loopback is refused (the bus has no credentials)")
	fs.BoolVar(&o.noBus, "no-bus", false, "publish no Kaimon event bus")
	fs.BoolVar(&o.auth, "auth", false, "require credentials from every client, node and leaf node (issue them with shoal creds)")
	fs.StringVar(&o.authDir, "auth-dir", "", "`directory` of the keys that sign credentials (default: $XDG_DATA_HOME/shoal/auth)")
	fs.BoolVar(&o.tlsVerify, "tls-verify-clients", false, "require every client and leaf node to present a certificate --tls-ca signed")
	fs.StringVar(&o.leafListen, "leaf-listen", "", "accept leaf nodes (machines that dial out) on this `host:port` (e.g. 127.0.0.1:7422)")
	fs.StringVar(&o.cluster, "cluster", "", "join a NATS cluster of this `name` (with --routes)")
	fs.StringVar(&o.clusterListen, "cluster-listen", "127.0.0.1:6222", "`host:port` other cluster members route to")
	fs.StringVar(&o.routes, "routes", "", "comma-separated nats-route://host:port `URLs` of the cluster's members")
	fs.StringVar(&o.serverName, "server-name", "", "this NATS server's `name`, unique in a cluster (default: the node name)")
	fs.StringVar(&o.monitor, "monitor", "", "serve the NATS server's HTTP monitoring (/varz, /connz, /jsz, …) on this `host:port`; a bare port listens on 127.0.0.1; off loopback it needs --auth")
	fs.StringVar(&o.metrics, "metrics", "", "serve Prometheus metrics of the coordinator and its node at /metrics on this `host:port`; a bare port listens on 127.0.0.1")
	fs.Int64Var(&o.fleet.Tokens, "budget-tokens", 0, "set the fleet's budget at start: the most `tokens` every agent's turns together may use (shoal budget set --fleet changes it later)")
	fs.Float64Var(&o.fleet.USD, "budget-usd", 0, "set the fleet's budget at start: the most `dollars` every agent's turns together may cost, where the CLIs report a cost")
	fs.StringVar(&o.external.url, "nats", "", "use the NATS deployment at this `URL` and embed no server")
	fs.StringVar(&o.external.creds, "creds", "", "with --nats: the coordinator's credentials `file` (shoal creds coordinator NAME)")
	t := &o.external.tls
	fs.StringVar(&t.cert, "tls-cert", "", "PEM `file` of the server's TLS certificate for client, leaf-node and route connections (with --nats: this coordinator's client certificate)")
	fs.StringVar(&t.key, "tls-key", "", "PEM `file` of that certificate's private key")
	fs.StringVar(&t.ca, "tls-ca", "", "PEM `file` of the CA that verifies cluster members and, with --tls-verify-clients, clients (with --nats: the CA of the deployment's certificate)")
	o.external.timeout = 30 * time.Second
}

// hostPort reads a host:port flag.
func hostPort(flag, s string) (string, int, error) {
	host, port, err := net.SplitHostPort(s)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < -1 || n > 65535 {
		return "", 0, usagef("--%s %q is not host:port (e.g. 127.0.0.1:7422)", flag, s)
	}
	return host, n, nil
}

func (o *upOptions) brokerConfig(env *environment, log *slog.Logger) (broker.Config, error) {
	store := o.store
	if store == "" {
		store = filepath.Join(dataHome(env.getenv), "shoal", "jetstream")
	}
	if o.maxPayload > 64<<20 || o.maxPayload < 1<<10 {
		return broker.Config{}, usagef("--max-payload %s is out of range (1KiB to 64MiB)", sizeValue{&o.maxPayload})
	}
	cfg := broker.Config{
		Host:       o.host,
		Port:       o.port,
		StoreDir:   store,
		MaxPayload: int32(o.maxPayload),
		Logger:     log,
		Assets:     o.assets(),
	}
	if o.port == 0 {
		return cfg, usagef("--port 0 is not a port (use -1 for any free port)")
	}
	if o.auth {
		dir := o.authDir
		if dir == "" {
			dir = filepath.Join(dataHome(env.getenv), "shoal", "auth")
		}
		auth, err := broker.OpenAuthority(dir)
		if err != nil {
			return cfg, err
		}
		cfg.Auth = auth
	} else if o.authDir != "" {
		return cfg, usagef("--auth-dir needs --auth")
	}
	tls := o.external.tls
	cfg.TLS = broker.TLSConfig{Cert: tls.cert, Key: tls.key, CA: tls.ca, VerifyClients: o.tlsVerify}
	if o.leafListen != "" {
		host, port, err := hostPort("leaf-listen", o.leafListen)
		if err != nil {
			return cfg, err
		}
		cfg.Leaf = broker.LeafConfig{Host: host, Port: port}
	}
	if o.monitor != "" {
		host, port, err := listenAddr("monitor", o.monitor)
		if err != nil {
			return cfg, err
		}
		if port == 0 {
			port = -1 // the server's "any free port"
		}
		cfg.Monitor = broker.MonitorConfig{Host: host, Port: port}
	}
	// The server is named as its node is, unless told otherwise (a
	// cluster needs a name per member).
	cfg.ServerName = o.serverName
	if cfg.ServerName == "" {
		cfg.ServerName = o.node.nodeName()
	}
	if o.cluster != "" {
		host, port, err := hostPort("cluster-listen", o.clusterListen)
		if err != nil {
			return cfg, err
		}
		routes := splitList(o.routes)
		if len(routes) == 0 {
			return cfg, usagef("--cluster %s needs --routes: the nats-route:// URLs of the cluster's members", o.cluster)
		}
		cfg.Cluster = broker.ClusterConfig{Name: o.cluster, Host: host, Port: port, Routes: routes}
	} else if o.routes != "" {
		return cfg, usagef("--routes needs --cluster NAME")
	}
	return cfg, nil
}

// assets are the stream and bucket limits from the flags.
// keptFromAgents are the coordinator's own paths its node's sandboxed
// agents may not read: its store, its signing keys, its TLS key and the
// credentials it uses an external NATS with.
func (o *upOptions) keptFromAgents(env *environment) []string {
	store, auth := o.store, o.authDir
	if store == "" {
		store = filepath.Join(dataHome(env.getenv), "shoal", "jetstream")
	}
	if auth == "" {
		auth = filepath.Join(dataHome(env.getenv), "shoal", "auth")
	}
	return []string{store, auth, o.external.tls.key, o.external.creds}
}

func (o *upOptions) assets() broker.Assets {
	replicas := o.replicas
	if replicas == 0 && o.cluster != "" {
		replicas = 3
	}
	return broker.Assets{
		MaxAge:        negativeIfZero(o.maxAge),
		MaxBytes:      negativeIfZero(o.maxBytes),
		Duplicates:    o.duplicates,
		NodeTTL:       o.nodeTTL,
		Replicas:      replicas,
		ReposMaxBytes: negativeIfZero(o.reposMaxBytes),
	}
}

// negativeIfZero maps the command line's "0 means no limit" onto the
// broker's "negative means no limit" (where zero means the default).
func negativeIfZero[T time.Duration | int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// connector opens the coordinator's connections to the fabric, each
// named for what uses it.
type connector func(name string) (*nats.Conn, error)

// embed starts the embedded server and returns how to connect to it.
func (o *upOptions) embed(ctx context.Context, env *environment, log *daemonLog) (connector, func(), error) {
	cfg, err := o.brokerConfig(env, log.Logger)
	if err != nil {
		return nil, nil, err
	}
	b, err := broker.New(cfg)
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	if err := b.Start(ctx); err != nil {
		return nil, nil, err
	}
	log.status("NATS listening on %s", b.ClientURL())
	log.status("JetStream store %s", b.StoreDir())
	if cfg.Auth != nil {
		log.status("authentication on; credentials are issued with `shoal creds` (keys in %s)", cfg.Auth.Dir())
	}
	if u := b.LeafURL(); u != "" {
		log.status("leaf nodes connect to %s", u)
	}
	if u := b.ClusterURL(); u != "" {
		log.status("cluster %s, routes on %s", o.cluster, u)
	}
	if u := b.MonitorURL(); u != "" {
		log.status("NATS monitoring %s (/varz, /connz, /jsz, /healthz)", u)
	}
	o.disconnectNode = b.DisconnectNode
	return func(name string) (*nats.Conn, error) { return b.Connect(nats.Name(name)) }, b.Shutdown, nil
}

// external connects to a NATS deployment Shoal does not run, provisions
// the fabric's stream and buckets there, and returns how to connect.
func (o *upOptions) useExternal(ctx context.Context, env *environment, log *daemonLog) (connector, func(), error) {
	if o.auth || o.cluster != "" || o.leafListen != "" || o.tlsVerify || o.monitor != "" {
		return nil, nil, usagef("--nats uses a NATS deployment Shoal does not run: --auth, --cluster, --leaf-listen, --monitor and --tls-verify-clients configure the embedded server and cannot go with it")
	}
	if c, err := o.external.credentials(); err != nil {
		return nil, nil, err
	} else if c != nil && c.Role != broker.RoleCoordinator {
		return nil, nil, usagef("the credentials in %s are for %s %s; the coordinator needs `shoal creds coordinator NAME`", o.external.creds, c.Role, c.Name)
	}
	o.external.external = true // its errors say what sent shoal up there
	connect := func(name string) (*nats.Conn, error) {
		return o.external.connect(env, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	}
	nc, err := connect("shoal-provision")
	if err != nil {
		return nil, nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	if err := broker.Provision(ctx, js, o.assets()); err != nil {
		return nil, nil, fmt.Errorf("NATS at %s: %w", o.external.url, err)
	}
	log.status("using NATS at %s", nc.ConnectedUrlRedacted())
	return connect, func() {}, nil
}

func (o *upOptions) run(ctx context.Context, env *environment, _ []string) error {
	if o.maxDepth < 0 {
		return usagef("--max-depth %d: give 0 to forbid agents opening agents, or a depth from 1", o.maxDepth)
	}
	if err := schemas.CheckBudget(o.fleet.Tokens, o.fleet.USD); err != nil {
		return usagef("--budget-tokens %d, --budget-usd %g: a budget is 0 (no limit) or more tokens and a finite number of dollars", o.fleet.Tokens, o.fleet.USD)
	}
	if !o.noNode {
		if err := o.node.checkName(); err != nil {
			return err
		}
	}
	if o.replicas > 1 && o.cluster == "" && o.external.url == "" {
		return usagef("--replicas %d needs servers to keep the copies: a cluster (--cluster NAME --routes …) or a NATS deployment (--nats URL); the embedded server alone keeps 1", o.replicas)
	}
	if o.replicas < 0 {
		return usagef("--replicas %d: copies are 1 or more (0: the default)", o.replicas)
	}
	origin, err := o.publicOrigin()
	if err != nil {
		return err
	}
	if !o.noMCP {
		// Refused now, before the server says it listens.
		if err := bridge.CheckListen(o.mcpListen, bridge.HTTPConfig{Token: o.mcpToken, ObserverToken: o.mcpObserver}); err != nil {
			return usagef("%v", err)
		}
	}
	if o.memoryLimit > 0 && env.getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(o.memoryLimit)
	}
	dlog, err := o.log.open(env)
	if err != nil {
		return err
	}
	log := dlog.Logger
	var connect connector
	var shutdown func()
	if o.external.url != "" {
		connect, shutdown, err = o.useExternal(ctx, env, dlog)
	} else {
		connect, shutdown, err = o.embed(ctx, env, dlog)
	}
	if err != nil {
		return err
	}
	defer shutdown()
	say := dlog.status
	serveMetrics, err := o.listenMetrics(say)
	if err != nil {
		return err
	}

	// The coordinator's services: the relay for confined nodes, the node
	// monitor, the fabric service, the MCP endpoint and the Kaimon bus.
	var workers sync.WaitGroup
	defer workers.Wait()
	bridgeCtx, stopBridge := context.WithCancel(ctx)
	defer stopBridge()
	errc := make(chan error, 5)
	if serveMetrics != nil {
		workers.Go(func() {
			if err := serveMetrics(bridgeCtx); err != nil {
				errc <- fmt.Errorf("metrics: %w", err)
			}
		})
	}
	// Confined nodes are told of the MCP endpoint once it listens.
	grant := &endpointGrant{known: make(chan struct{})}
	if err := o.runCoordinator(bridgeCtx, connect, log, &workers, errc, grant.get); err != nil {
		return err
	}
	mcpURL := o.node.mcpURL
	if !o.noMCP {
		url, err := o.serveMCP(bridgeCtx, connect, log, &workers, errc, origin)
		if err != nil {
			return err
		}
		say("MCP endpoint %s", url)
		if o.mcpToken == "" && (o.auth || o.external.url != "") {
			// Each node's key for its agents is made from the token.
			log.Warn("agents on nodes with credentials get none of Shoal's tools: the coordinator makes each such node's key from --mcp-token, which is not given")
		}
		if origin != "" {
			say("reached through %s (%s%s for MCP clients)", origin+"/", origin, bridge.MCPPath)
		}
		if !o.noWeb {
			say("web dashboard %s%s", strings.TrimSuffix(url, bridge.MCPPath)+"/", webLogin(o.mcpToken, o.mcpObserver))
		}
		if mcpURL == "" {
			mcpURL = url
		}
	}
	grant.set(mcpURL, o.mcpToken)
	if !o.noBus {
		address, err := o.runBus(bridgeCtx, env, connect, log, &workers, errc)
		if err != nil {
			return err
		}
		say("Kaimon bus %s", address)
	}

	// The local node stops before the broker, so it can close its agents
	// and store their last events.
	var nodeDone <-chan error
	if !o.noNode {
		o.node.mcpURL = mcpURL
		o.node.mcpToken = o.mcpToken
		nc, err := connect(o.node.connName())
		if err != nil {
			return err
		}
		defer nc.Close()
		o.node.unreadable = append(o.node.unreadable, o.keptFromAgents(env)...)
		h, err := o.node.host(env, nc, false, log)
		if err != nil {
			return err
		}
		if nodeDone, err = runHost(ctx, h); err != nil {
			return fmt.Errorf("node %s: %w", h.Name(), err)
		}
		say("node %s ready", h.Name())
	}
	say("ready; Ctrl-C stops")
	select {
	case <-ctx.Done():
	case err := <-errc:
		say("stopping")
		stopBridge()
		if nodeDone != nil {
			<-nodeDone
		}
		return err
	}
	say("stopping")
	if nodeDone != nil {
		if err := <-nodeDone; err != nil {
			log.Warn("node stopped with an error", "err", err)
		}
	}
	stopBridge()
	workers.Wait()
	shutdown()
	say("stopped")
	return nil
}

// endpointGrant is the MCP endpoint as the relay tells confined nodes of
// it: its URL and token, known once it listens.
type endpointGrant struct {
	known      chan struct{}
	url, token string
}

// set makes the endpoint known; called once.
func (g *endpointGrant) set(url, token string) {
	g.url, g.token = url, token
	close(g.known)
}

// get waits until the endpoint is known, or ctx ends (then nothing).
func (g *endpointGrant) get(ctx context.Context) (url, token string) {
	select {
	case <-g.known:
		return g.url, g.token
	case <-ctx.Done():
		return "", ""
	}
}

// service is one of the coordinator's own services, shaped alike: made
// from a Config, run until its context ends, ready when it answers.
type service interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// runCoordinator starts the coordinator's services, each on its own
// connection, and returns once each is ready: the relay confined nodes
// write through, the node-loss monitor, and the fabric service scoped
// clients go through.
func (o *upOptions) runCoordinator(ctx context.Context, connect connector, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error, mcp func(context.Context) (string, string)) error {
	var relayConn outage
	var refusals coordinator.RelayMetrics
	var failures coordinator.ServiceMetrics
	if o.counts != nil {
		refusals, failures = o.counts, o.counts
	}
	services := []struct {
		name string
		make func(nc *nats.Conn) (service, error)
	}{
		{"relay", func(nc *nats.Conn) (service, error) {
			r, err := coordinator.NewRelay(coordinator.RelayConfig{Conn: nc, Logger: log, Metrics: refusals, MCP: mcp, Dial: connect})
			if err == nil && o.counts != nil {
				o.counts.WatchAgents(r.AgentsByStatus)
			}
			return r, err
		}},
		{"monitor", func(nc *nats.Conn) (service, error) {
			return coordinator.NewMonitor(coordinator.MonitorConfig{Conn: nc, Logger: log, Disconnect: o.disconnectNode, Relay: relayConn.state})
		}},
		{"ledger", func(nc *nats.Conn) (service, error) {
			l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: nc, Logger: log})
			if err == nil && o.counts != nil {
				o.counts.WatchSpend(func() []schemas.SpentRow { return l.Spent().Rows })
			}
			return l, err
		}},
		{"fabric", func(nc *nats.Conn) (service, error) {
			f, err := client.NewDirect(nc, client.Config{})
			if err == nil {
				err = f.WatchNodes(ctx)
			}
			if err == nil {
				// Every scoped client's monitor asks what waits each second.
				err = f.WatchPermits(ctx)
			}
			if err != nil {
				return nil, err
			}
			return coordinator.NewService(coordinator.ServiceConfig{Conn: nc, Client: f, Version: semver(), Metrics: failures})
		}},
	}
	for _, sv := range services {
		ready := make(chan error, 1)
		conn := new(outage)
		if sv.name == "relay" {
			conn = &relayConn
		}
		workers.Go(func() { supervise(ctx, sv.name, connect, sv.make, log, ready, errc, conn) })
		select {
		case err := <-ready:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return o.setFleetBudget(ctx, connect)
}

// setFleetBudget sets the fleet's budget --budget-tokens and --budget-usd
// give, if either does.
func (o *upOptions) setFleetBudget(ctx context.Context, connect connector) error {
	if o.fleet.Tokens == 0 && o.fleet.USD == 0 {
		return nil
	}
	nc, err := connect("shoal-budget")
	if err != nil {
		return err
	}
	defer nc.Close()
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		return err
	}
	// The limit not given stays as it is: a person's dollar cap is not
	// lifted by a restart of shoal up --budget-tokens N.
	o.fleet.Fleet = true
	o.fleet.KeepTokens, o.fleet.KeepUSD = o.fleet.Tokens == 0, o.fleet.USD == 0
	if err := f.SetBudget(ctx, o.fleet); err != nil {
		return fmt.Errorf("the fleet's budget: %w", err)
	}
	return nil
}

// supervise runs one of the coordinator's services on a connection of its
// own until ctx ends. When the server closes that connection, the service
// is made again on a new one, and the log says so; conn follows each
// connection's losses and returns, which the log says too. ready receives
// the first start's outcome; errc a later failure.
func supervise(ctx context.Context, name string, connect connector, start func(*nats.Conn) (service, error), log *slog.Logger, ready, errc chan<- error, conn *outage) {
	first := true
	fail := func(err error) {
		err = fmt.Errorf("%s: %w", name, err)
		if first {
			ready <- err
		} else {
			errc <- err
		}
	}
	for {
		nc, err := connect("shoal-" + name)
		if err != nil {
			fail(err)
			return
		}
		closed := make(chan struct{})
		nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
		conn.watch(nc, log)
		s, err := start(nc)
		if err != nil {
			nc.Close()
			fail(err)
			return
		}
		run, stop := context.WithCancel(ctx)
		ended := make(chan error, 1)
		go func() { ended <- s.Run(run) }()
		if first {
			select {
			case <-s.Ready():
				ready <- nil
				first = false
			case err := <-ended:
				stop()
				nc.Close()
				fail(err)
				return
			case <-ctx.Done():
				stop()
				<-ended
				nc.Close()
				ready <- ctx.Err()
				return
			}
		}
		select {
		case <-ctx.Done():
			<-ended
			stop()
			nc.Close()
			return
		case err := <-ended:
			stop()
			if !nc.IsClosed() && ctx.Err() == nil && err != nil {
				nc.Close()
				fail(err)
				return
			}
			nc.Close()
			if ctx.Err() != nil {
				return
			}
		case <-closed:
			stop()
			<-ended
		}
		why := "closed"
		if err := nc.LastError(); err != nil {
			why = err.Error()
		}
		log.Warn("the server closed a service's NATS connection; connecting again", "service", name, "closed", why)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// serveMCP starts the MCP endpoint and returns its URL once it listens.
// origin, when set, is where browsers and MCP clients reach it through a
// reverse proxy (--public-url).
func (o *upOptions) serveMCP(ctx context.Context, connect connector, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error, origin string) (string, error) {
	f, err := newRedialing(ctx, "shoal-mcp", connect, log)
	if err != nil {
		return "", err
	}
	depth := o.maxDepth
	if depth == 0 {
		depth = -1 // none
	}
	var calls bridge.MCPMetrics
	if o.counts != nil {
		calls = o.counts
	}
	m := bridge.NewMCP(bridge.MCPConfig{Client: f, Version: semver(), Logger: log, MaxDepth: depth, Metrics: calls})
	urls := make(chan string, 1)
	done := make(chan error, 1)
	workers.Go(func() {
		defer f.closeAll()
		cfg := bridge.HTTPConfig{Token: o.mcpToken, ObserverToken: o.mcpObserver}
		if origin != "" {
			cfg.AllowedOrigins = []string{origin}
		}
		if !o.noWeb {
			cfg.Web = web.New(web.Config{Client: f, Token: o.mcpToken, ObserverToken: o.mcpObserver, Origin: origin, Logger: log})
		}
		err := m.ListenHTTP(ctx, o.mcpListen, cfg, func(u string) { urls <- u })
		if err != nil {
			err = fmt.Errorf("%w (another address: --mcp-listen; none: --no-mcp)", err)
		}
		done <- err
		if err != nil {
			errc <- err
		}
	})
	select {
	case u := <-urls:
		return u, nil
	case err := <-done:
		return "", usagef("%v", err)
	}
}

// consumerToken is name as a JetStream consumer name may hold it: what
// such a name may not hold (whitespace, '.', '*', '>', path separators)
// made '_'.
func consumerToken(name string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || strings.ContainsRune(".*>/\\", r) {
			return '_'
		}
		return r
	}, name)
}

// runBus starts the Kaimon bus and returns its address once it is bound.
func (o *upOptions) runBus(ctx context.Context, env *environment, connect connector, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error) (string, error) {
	address := o.bus
	if address == "" {
		address = "ipc://" + filepath.Join(cacheHome(env.getenv), "kaimon", "sock", "kaimon-events.sock")
	}
	nc, err := connect("shoal-bus")
	if err != nil {
		return "", err
	}
	// Every member of a cluster runs a bus of its own, each for its own
	// subscribers: on one consumer they would share the events, a third
	// each, every bus's order broken.
	durable := ""
	if o.cluster != "" {
		server := o.serverName
		if server == "" {
			server = o.node.nodeName()
		}
		durable = "shoal-bus-" + consumerToken(server)
	}
	bus, err := bridge.NewBus(bridge.BusConfig{
		Conn: nc, Address: address, Logger: log, Durable: durable,
		StateFile: filepath.Join(dataHome(env.getenv), "shoal", "bus.pos"),
		Grace:     500 * time.Millisecond,
		// The bus has no credentials: it stays off the network, as no
		// listener of shoal up's goes off loopback unprotected.
		LoopbackOnly: true,
	})
	if err != nil {
		nc.Close()
		return "", usagef("%v", err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	workers.Go(func() {
		defer nc.Close()
		err := bus.Run(ctx, ready)
		done <- err
		if err != nil {
			errc <- fmt.Errorf("the Kaimon bus: %w", err)
		}
	})
	select {
	case <-ready:
		return address, nil
	case err := <-done:
		return "", usagef("%v", err) // an address in use, as a port in use is
	}
}

// publicOrigin checks --public-url and returns its origin (scheme, host
// and port), or "" when it is not given.
func (o *upOptions) publicOrigin() (string, error) {
	if o.publicURL == "" {
		return "", nil
	}
	u, err := url.Parse(o.publicURL)
	switch {
	case err != nil:
		return "", usagef("--public-url %q: %v", o.publicURL, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
		return "", usagef("--public-url %q: give the address browsers use, http:// or https:// and a host (e.g. https://shoal.example.com)", o.publicURL)
	case strings.Trim(u.Path, "/") != "", u.RawQuery != "", u.Fragment != "", u.User != nil:
		return "", usagef("--public-url %q: the proxy must pass the whole of its host to Shoal: give no path, query or user, only scheme, host and port", o.publicURL)
	case o.noMCP:
		return "", usagef("--public-url names the MCP endpoint and dashboard, which --no-mcp turns off")
	case o.mcpToken == "" && o.mcpObserver == "":
		return "", usagef("--public-url needs --mcp-token: behind a proxy every request comes from loopback, so without a token everyone who reaches the proxy could drive every agent")
	}
	// As a browser sends it: lower case, no default port.
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "https" && p == "443") || (u.Scheme == "http" && p == "80") {
		host = strings.ToLower(u.Hostname())
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	}
	return u.Scheme + "://" + host, nil
}

// webLogin says how a browser signs in to the dashboard, without printing
// a token.
func webLogin(token, observer string) string {
	if token == "" && observer == "" {
		return ""
	}
	return " (sign in once with ?token=<the --mcp-token or --mcp-observer-token>)"
}
