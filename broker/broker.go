package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// Broker is an embedded NATS server with JetStream and the fabric's assets.
type Broker struct {
	cfg Config
	srv *server.Server
	log *serverLog

	monitor     *http.Server // the HTTP monitoring (monitor.go)
	monitorAddr *net.TCPAddr

	shutdownOnce sync.Once
	unlock       func() // releases the store dir
}

// New checks cfg and prepares a server; Start runs it.
func New(cfg Config) (*Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: newServerLog(cfg.Logger)}
	b.log.store = cfg.StoreDir
	opts, err := b.options()
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure NATS server: %w", err)
	}
	srv.SetLoggerV2(b.log, false, false, false)
	b.srv = srv
	return b, nil
}

// maxConns bounds the clients the server takes at once to half of what
// the process may open, limit files (NATS's own default of 65,536 at
// most): every client is a file descriptor, and the store opens its
// files from the same table. A store that could not open one failed its
// writes until it was restarted, when one holder of credentials (an
// observer's) opened connections until none were left. Past the bound a
// client is refused ("maximum connections exceeded"). The MCP endpoint
// and dashboard take up to a quarter (bridge), and the rest is the
// store's and the process's own.
func maxConns(limit uint64) int {
	if limit == 0 {
		return server.DEFAULT_MAX_CONNECTIONS
	}
	return int(max(min(limit/2, server.DEFAULT_MAX_CONNECTIONS), 16))
}

// silentLinkPings are the server's pings for a stream whose duplicate
// window is dup: a connection that answers none of MaxPingsOut of them is
// closed by the next, within half the window. What a client sent into a
// link that went silent (a dropped Wi-Fi, a NAT, a VM migrated: TCP keeps
// the bytes and delivers them when the path comes back) could otherwise
// reach the server after the window, and an event its sender's next life
// (a node restarted) stored meanwhile was stored again: the window is
// what drops a copy. The server's own default kept a silent connection
// for minutes (a ping every two minutes). Pings every dup/6 (5 s at the
// default window, 1 s at least), two unanswered at most: closed after
// three intervals.
func silentLinkPings(dup time.Duration) (interval time.Duration, maxOut int) {
	return max(dup/6, time.Second), 2
}

func (b *Broker) options() (*server.Options, error) {
	c := b.cfg
	opts := &server.Options{
		ServerName:            c.ServerName,
		Host:                  c.Host,
		Port:                  c.Port,
		DontListen:            c.DontListen,
		JetStream:             true,
		StoreDir:              c.StoreDir,
		MaxPayload:            c.MaxPayload,
		MaxPending:            max(int64(c.MaxPayload)*4, 64<<20),
		NoSigs:                true,
		NoSystemAccount:       false,
		DisableShortFirstPing: true,
		MaxConn:               maxConns(openFileLimit()),
	}
	opts.PingInterval, opts.MaxPingsOut = silentLinkPings(c.Assets.withDefaults().Duplicates)
	if c.Cluster.Name != "" {
		opts.Cluster = server.ClusterOpts{Name: c.Cluster.Name, Host: c.Cluster.Host, Port: c.Cluster.Port}
		if c.Auth != nil {
			// Routes authenticate with the secret every member's copy of
			// the authority holds.
			opts.Cluster.Username, opts.Cluster.Password = routeUser, c.Auth.routeSecret
		}
		for _, r := range c.Cluster.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("route %q: %w", r, err)
			}
			if c.Auth != nil && u.User == nil {
				u.User = url.UserPassword(routeUser, c.Auth.routeSecret)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if c.Leaf.Port != 0 {
		opts.LeafNode = server.LeafNodeOpts{Host: c.Leaf.Host, Port: c.Leaf.Port}
	}
	// c.Monitor is served by the broker itself (monitor.go).
	if c.Auth != nil {
		if err := c.Auth.apply(opts); err != nil {
			return nil, err
		}
	}
	if c.TLS.enabled() {
		if err := applyTLS(opts, c.TLS); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// Start runs the server, waits until it accepts connections and
// provisions the stream and buckets. It returns a clear error when the
// store is not writable, the port is taken or JetStream cannot start.
func (b *Broker) Start(ctx context.Context) error {
	if err := checkWritable(b.cfg.StoreDir); err != nil {
		return err
	}
	unlock, err := lockStore(b.cfg.StoreDir)
	if err != nil {
		return err
	}
	if err := checkListeners(b.cfg); err != nil {
		unlock()
		return err
	}
	said, err := adoptStore(b.cfg)
	if err != nil {
		unlock()
		return err
	}
	if said != "" {
		b.cfg.Logger.Warn(said)
	}
	b.unlock = unlock
	go b.srv.Start()
	ready := make(chan bool, 1)
	go func() { ready <- b.srv.ReadyForConnections(b.cfg.ReadyTimeout) }()
	select {
	case ok := <-ready:
		if !ok {
			b.Shutdown()
			if err := b.log.fatal(); err != nil {
				return err
			}
			return fmt.Errorf("NATS server not ready after %s", b.cfg.ReadyTimeout)
		}
	case err := <-b.log.fatalCh:
		b.Shutdown()
		return err
	case <-ctx.Done():
		b.Shutdown()
		return ctx.Err()
	}
	if b.cfg.Monitor.Port != 0 {
		if err := b.serveMonitoring(); err != nil {
			b.Shutdown()
			return err
		}
	}
	nc, err := b.Connect(nats.Name("shoal-broker"))
	if err != nil {
		b.Shutdown()
		return fmt.Errorf("connect to the embedded server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Shutdown()
		return err
	}
	if err := Provision(ctx, js, b.cfg.Assets); err != nil {
		b.Shutdown()
		return b.explainStorage(err)
	}
	return nil
}

// Connect opens an in-process client connection to the server.
func (b *Broker) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := []nats.Option{nats.InProcessServer(b.srv)}
	if b.cfg.Auth != nil {
		all = append(all, b.cfg.Auth.internal())
	}
	return nats.Connect("", append(all, opts...)...)
}

// ClientURL is the URL clients dial, e.g. nats://127.0.0.1:4222.
func (b *Broker) ClientURL() string { return b.srv.ClientURL() }

// DisconnectNode closes the connections the life instance of node has
// to this server, its own and its events' (schemas.NodeConnName),
// whenever they were made, and reports how many. What the server has not
// read of them is dropped with them: a node taken for lost whose link
// comes back cannot deliver, after its agents were closed, events it sent
// before, nor through a connection it made again within its lease. A new
// life's, under another instance, are left. Connections of a node of an
// earlier version, named without an instance, are closed if they were
// made before before (its last heartbeat).
func (b *Broker) DisconnectNode(node, instance string, before time.Time) int {
	life := schemas.NodeConnName(node, instance)
	older := "shoal node " + node
	// Found first, then closed: closing while paging would move the
	// pages under the offset.
	var cids []uint64
	for offset := 0; ; {
		c, err := b.srv.Connz(&server.ConnzOptions{Offset: offset, Limit: 1024})
		if err != nil || len(c.Conns) == 0 {
			break
		}
		for _, ci := range c.Conns {
			name := strings.TrimSuffix(ci.Name, " (events)")
			if (instance != "" && name == life) || (name == older && ci.Start.Before(before)) {
				cids = append(cids, ci.Cid)
			}
		}
		offset += len(c.Conns)
	}
	n := 0
	for _, cid := range cids {
		if b.srv.DisconnectClientByID(cid) == nil {
			n++
		}
	}
	return n
}

// LeafURL is the URL leaf nodes dial, or "" when leaf connections are off.
func (b *Broker) LeafURL() string {
	if b.cfg.Leaf.Port == 0 {
		return ""
	}
	v, err := b.srv.Varz(nil)
	if err != nil || v.LeafNode.Port <= 0 {
		return ""
	}
	return fmt.Sprintf("nats-leaf://%s", net.JoinHostPort(v.LeafNode.Host, strconv.Itoa(v.LeafNode.Port)))
}

// MonitorURL is the base URL of the server's HTTP monitoring (append
// /varz, /connz, …), or "" when it is off.
func (b *Broker) MonitorURL() string {
	if b.monitorAddr == nil {
		return ""
	}
	return "http://" + b.monitorAddr.String()
}

// ClusterURL is the URL other cluster members route to, or "".
func (b *Broker) ClusterURL() string {
	if b.cfg.Cluster.Name == "" {
		return ""
	}
	addr := b.srv.ClusterAddr()
	if addr == nil {
		return ""
	}
	return fmt.Sprintf("nats-route://%s", addr.String())
}

// StoreDir is where JetStream keeps its files.
func (b *Broker) StoreDir() string { return b.cfg.StoreDir }

// Shutdown stops the server and waits for it to finish writing. It is
// safe to call more than once.
func (b *Broker) Shutdown() {
	b.shutdownOnce.Do(func() {
		b.stopMonitoring()
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		if b.unlock != nil {
			b.unlock()
		}
	})
}

// checkWritable makes dir; that a file can be written in it is proved by
// the store's lock, made or opened for writing next, so a bad store dir
// fails with its own name rather than deep inside JetStream, and a store
// in use has nothing written into it.
func checkWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return schemas.Errf(schemas.CodeInvalid, "store dir %s: %v (give another --store)", dir, unwrapPath(err))
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}

func randomSecret() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("broker: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// JetStream's refusals of an asset whose bound passes what the server may
// store: "insufficient storage resources available" on one server,
// "insufficient resources" in a cluster.
const (
	errNoStorage   jetstream.ErrorCode = 10047
	errNoResources jetstream.ErrorCode = 10023
)

// explainStorage says, of a provisioning refused for want of storage, how
// much the store's file system has, what the server takes of it and what
// the fabric's bounds ask, and which to lower; other errors it returns as
// they are.
func (b *Broker) explainStorage(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || (apiErr.ErrorCode != errNoStorage && apiErr.ErrorCode != errNoResources) {
		return err
	}
	a := b.cfg.Assets.withDefaults()
	var asked int64 = PermitsMaxBytes
	for _, n := range []int64{a.MaxBytes, a.ReposMaxBytes} {
		if n > 0 {
			asked += n
		}
	}
	free := "an unknown amount"
	if n, ok := freeBytes(b.cfg.StoreDir); ok {
		free = sizeText(n)
	}
	return schemas.Errf(schemas.CodeInvalid, "%v: the store %s's file system has %s free, of which JetStream takes 3/4 when it starts, and the fabric's bounds ask %s (the events, --stream-max-bytes %s; the repositories, --repos-max-bytes %s; permission requests %s): give the store more room, or lower --repos-max-bytes and --stream-max-bytes",
		err, b.cfg.StoreDir, free, sizeText(asked), boundText(a.MaxBytes), boundText(a.ReposMaxBytes), sizeText(PermitsMaxBytes))
}

// boundText is a size bound as a flag takes it: a size, or "none".
func boundText(n int64) string {
	if n <= 0 {
		return "none"
	}
	return sizeText(n)
}

// sizeText is n bytes in GiB or MiB.
func sizeText(n int64) string {
	if n >= 1<<30 {
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}
