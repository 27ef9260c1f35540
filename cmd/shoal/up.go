package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/broker"
)

// upOptions are the settings of `shoal up`.
type upOptions struct {
	host       string
	port       int
	store      string
	maxPayload int64
	maxAge     time.Duration
	maxBytes   int64
	duplicates time.Duration
	nodeTTL    time.Duration
	logLevel   string
	noNode     bool
	node       nodeOptions
	mcpListen  string
	mcpToken   string
	noMCP      bool
	bus        string
	noBus      bool
}

func upCommand() *command {
	return &command{
		name:    "up",
		summary: "run the coordinator: embedded NATS with JetStream",
		help: `
Runs the coordinator on this machine: an embedded NATS server with
JetStream that keeps every agent event in the stream AGENTS and the agent
and node records in the KV buckets shoal_agents and shoal_nodes, and a
local node that runs agents here (unless --no-node).

By default it listens on 127.0.0.1:4222 only and keeps its state under
$XDG_DATA_HOME/shoal (~/.local/share/shoal). It stops cleanly on Ctrl-C
or SIGTERM; a restart on the same store keeps every event.`,
		flags: func(fs *flag.FlagSet) runner {
			o := &upOptions{}
			o.register(fs)
			return o.run
		},
	}
}

func (o *upOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.host, "host", broker.DefaultHost, "NATS client listen address; anything but loopback needs authentication")
	fs.IntVar(&o.port, "port", broker.DefaultPort, "NATS client port (-1 picks a free port)")
	fs.StringVar(&o.store, "store", "", "JetStream store directory (default $XDG_DATA_HOME/shoal/jetstream)")
	sizeFlag(fs, &o.maxPayload, "max-payload", broker.DefaultMaxPayload, "largest `size` of a message the server accepts")
	durationFlag(fs, &o.maxAge, "stream-max-age", broker.DefaultMaxAge, "drop events older than this `duration` (0 keeps them forever)")
	sizeFlag(fs, &o.maxBytes, "stream-max-bytes", broker.DefaultMaxBytes, "drop the oldest events beyond this `size` (0 means no limit)")
	durationFlag(fs, &o.duplicates, "stream-duplicates", broker.DefaultDuplicates, "`duration` in which a republished event is recognised and dropped")
	durationFlag(fs, &o.nodeTTL, "node-ttl", broker.DefaultNodeTTL, "a node whose heartbeat is older than this `duration` is lost")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.BoolVar(&o.noNode, "no-node", false, "run no agents on this machine: only the broker")
	o.node.register(fs, "node-name")
	fs.StringVar(&o.mcpListen, "mcp-listen", "127.0.0.1:7270", "`address` of the MCP endpoint (Streamable HTTP at /mcp)")
	fs.StringVar(&o.mcpToken, "mcp-token", "", "bearer `token` MCP clients must send; required off loopback")
	fs.BoolVar(&o.noMCP, "no-mcp", false, "serve no MCP endpoint")
	fs.StringVar(&o.bus, "bus", "", "Kaimon event bus `address` (default ipc://$XDG_CACHE_HOME/kaimon/sock/kaimon-events.sock)")
	fs.BoolVar(&o.noBus, "no-bus", false, "publish no Kaimon event bus")
}

func (o *upOptions) brokerConfig(env *environment) (broker.Config, error) {
	store := o.store
	if store == "" {
		store = filepath.Join(dataHome(env.getenv), "shoal", "jetstream")
	}
	if o.maxPayload > 64<<20 || o.maxPayload < 1<<10 {
		return broker.Config{}, usagef("--max-payload %s is out of range (1KiB to 64MiB)", sizeValue{&o.maxPayload})
	}
	log, err := newLogger(env.io.err, o.logLevel)
	if err != nil {
		return broker.Config{}, err
	}
	cfg := broker.Config{
		Host:       o.host,
		Port:       o.port,
		StoreDir:   store,
		MaxPayload: int32(o.maxPayload),
		Logger:     log,
		Assets: broker.Assets{
			MaxAge:     negativeIfZero(o.maxAge),
			MaxBytes:   negativeIfZero(o.maxBytes),
			Duplicates: o.duplicates,
			NodeTTL:    o.nodeTTL,
		},
	}
	if o.port == 0 {
		return cfg, usagef("--port 0 is not a port (use -1 for any free port)")
	}
	return cfg, nil
}

// negativeIfZero maps the command line's "0 means no limit" onto the
// broker's "negative means no limit" (where zero means the default).
func negativeIfZero[T time.Duration | int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

func (o *upOptions) run(ctx context.Context, env *environment, _ []string) error {
	cfg, err := o.brokerConfig(env)
	if err != nil {
		return err
	}
	b, err := broker.New(cfg)
	if err != nil {
		return usagef("%v", err)
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer b.Shutdown()
	out := env.io.out
	fmt.Fprintf(out, "shoal: NATS listening on %s\n", b.ClientURL())
	fmt.Fprintf(out, "shoal: JetStream store %s\n", b.StoreDir())

	// The bridge: the MCP endpoint and the Kaimon bus.
	var workers sync.WaitGroup
	defer workers.Wait()
	bridgeCtx, stopBridge := context.WithCancel(ctx)
	defer stopBridge()
	errc := make(chan error, 2)
	mcpURL := o.node.mcpURL
	if !o.noMCP {
		url, err := o.serveMCP(bridgeCtx, env, b, cfg.Logger, &workers, errc)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "shoal: MCP endpoint %s\n", url)
		if mcpURL == "" {
			mcpURL = url
		}
	}
	if err := o.runMonitor(bridgeCtx, b, cfg.Logger, &workers, errc); err != nil {
		return err
	}
	if err := o.serveFabric(bridgeCtx, b, &workers, errc); err != nil {
		return err
	}
	if !o.noBus {
		address, err := o.runBus(bridgeCtx, env, b, cfg.Logger, &workers, errc)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "shoal: Kaimon bus %s\n", address)
	}

	// The local node stops before the broker, so it can close its agents
	// and store their last events.
	var nodeDone <-chan error
	if !o.noNode {
		o.node.mcpURL = mcpURL
		o.node.mcpToken = o.mcpToken
		nc, err := b.Connect(nats.Name("shoal-local-node"))
		if err != nil {
			return err
		}
		defer nc.Close()
		h, err := o.node.host(env, nc, cfg.Logger)
		if err != nil {
			return err
		}
		if nodeDone, err = runHost(ctx, h); err != nil {
			return fmt.Errorf("node %s: %w", h.Name(), err)
		}
		fmt.Fprintf(out, "shoal: node %s ready\n", h.Name())
	}
	fmt.Fprintf(out, "shoal: ready; Ctrl-C stops\n")
	select {
	case <-ctx.Done():
	case err := <-errc:
		fmt.Fprintf(out, "shoal: stopping\n")
		stopBridge()
		if nodeDone != nil {
			<-nodeDone
		}
		return err
	}
	fmt.Fprintf(out, "shoal: stopping\n")
	if nodeDone != nil {
		if err := <-nodeDone; err != nil {
			cfg.Logger.Warn("node stopped with an error", "err", err)
		}
	}
	stopBridge()
	workers.Wait()
	b.Shutdown()
	fmt.Fprintf(out, "shoal: stopped\n")
	return nil
}

// serveMCP starts the MCP endpoint and returns its URL once it listens.
func (o *upOptions) serveMCP(ctx context.Context, env *environment, b *broker.Broker, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error) (string, error) {
	nc, err := b.Connect(nats.Name("shoal-mcp"))
	if err != nil {
		return "", err
	}
	f, err := bridge.NewFabric(nc, bridge.FabricConfig{})
	if err != nil {
		return "", err
	}
	if err := f.WatchNodes(ctx); err != nil {
		return "", err
	}
	m := bridge.NewMCP(bridge.MCPConfig{Fabric: f, Version: semver(), Logger: log})
	urls := make(chan string, 1)
	done := make(chan error, 1)
	workers.Go(func() {
		defer nc.Close()
		err := m.ListenHTTP(ctx, o.mcpListen, bridge.HTTPConfig{Token: o.mcpToken}, func(u string) { urls <- u })
		done <- err
		if err != nil {
			errc <- fmt.Errorf("MCP endpoint: %w", err)
		}
	})
	select {
	case u := <-urls:
		return u, nil
	case err := <-done:
		return "", usagef("%v", err)
	}
}

// serveFabric answers shoal.fabric.* (replay pages, placement).
func (o *upOptions) serveFabric(ctx context.Context, b *broker.Broker, workers *sync.WaitGroup, errc chan<- error) error {
	nc, err := b.Connect(nats.Name("shoal-fabric"))
	if err != nil {
		return err
	}
	f, err := bridge.NewFabric(nc, bridge.FabricConfig{})
	if err == nil {
		err = f.WatchNodes(ctx)
	}
	if err != nil {
		nc.Close()
		return err
	}
	workers.Go(func() {
		defer nc.Close()
		if err := bridge.Serve(ctx, nc, f, semver()); err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("fabric service: %w", err)
		}
	})
	return nil
}

// runMonitor starts the node-loss monitor.
func (o *upOptions) runMonitor(ctx context.Context, b *broker.Broker, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error) error {
	nc, err := b.Connect(nats.Name("shoal-monitor"))
	if err != nil {
		return err
	}
	m, err := bridge.NewMonitor(bridge.MonitorConfig{Conn: nc, Logger: log})
	if err != nil {
		nc.Close()
		return err
	}
	workers.Go(func() {
		defer nc.Close()
		if err := m.Run(ctx); err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("node monitor: %w", err)
		}
	})
	return nil
}

// runBus starts the Kaimon bus and returns its address once it is bound.
func (o *upOptions) runBus(ctx context.Context, env *environment, b *broker.Broker, log *slog.Logger, workers *sync.WaitGroup, errc chan<- error) (string, error) {
	address := o.bus
	if address == "" {
		address = "ipc://" + filepath.Join(cacheHome(env.getenv), "kaimon", "sock", "kaimon-events.sock")
	}
	nc, err := b.Connect(nats.Name("shoal-bus"))
	if err != nil {
		return "", err
	}
	bus, err := bridge.NewBus(bridge.BusConfig{
		Conn: nc, Address: address, Logger: log,
		StateFile: filepath.Join(dataHome(env.getenv), "shoal", "bus.pos"),
		Grace:     500 * time.Millisecond,
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
			errc <- fmt.Errorf("Kaimon bus: %w", err)
		}
	})
	select {
	case <-ready:
		return address, nil
	case err := <-done:
		return "", err
	}
}
