package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Leaf is an embedded NATS server that joins a hub as a leaf node: for a
// machine that can only dial out (a laptop, an Apple machine behind NAT).
// It listens nowhere and runs no JetStream; the node on the machine
// connects to it in process, and its traffic crosses the one outbound
// connection under the hub's credentials.
type Leaf struct {
	cfg LeafRemote
	srv *server.Server
	log *serverLog

	shutdownOnce sync.Once
}

// LeafRemote is the hub a Leaf joins.
type LeafRemote struct {
	// URL is the hub's leaf-node listener, e.g. nats-leaf://hub:7422 (tls://
	// when it requires TLS).
	URL string
	// Credentials is the .creds file the leaf connection authenticates
	// with; its rights bound everything that crosses it.
	Credentials string
	// TLS verifies the hub, and presents a client certificate if set.
	TLS ClientTLS
	// Logger receives the server's warnings and errors; discarded when nil.
	Logger *slog.Logger
}

// ClientTLS is a client's side of TLS: the CA that signed the server's
// certificate, and a certificate of its own when the server asks for one.
type ClientTLS struct {
	CA, Cert, Key string
}

// Config is a tls.Config for a client, or nil when nothing is set.
func (c ClientTLS) Config() (*tls.Config, error) {
	if c == (ClientTLS{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pool, err := LoadCA(c.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.Cert != "" || c.Key != "" {
		cert, err := LoadKeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// NewLeaf checks the remote and prepares the server.
func NewLeaf(cfg LeafRemote) (*Leaf, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("hub URL %q is not a URL like nats-leaf://host:7422", cfg.URL)
	}
	remote := &server.RemoteLeafOpts{URLs: []*url.URL{u}, Credentials: cfg.Credentials}
	if remote.TLSConfig, err = cfg.TLS.Config(); err != nil {
		return nil, err
	}
	remote.TLS = remote.TLSConfig != nil || u.Scheme == "tls"
	opts := &server.Options{
		DontListen:            true,
		NoSigs:                true,
		MaxPayload:            DefaultMaxPayload,
		DisableShortFirstPing: true,
		LeafNode:              server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{remote}, ReconnectInterval: time.Second},
	}
	l := &Leaf{cfg: cfg, log: newServerLog(cfg.Logger)}
	if l.srv, err = server.NewServer(opts); err != nil {
		return nil, fmt.Errorf("configure the leaf server: %w", err)
	}
	l.srv.SetLoggerV2(l.log, false, false, false)
	return l, nil
}

// Start runs the server and waits until its connection to the hub is up,
// which it keeps trying until ctx ends; then it says why it could not.
func (l *Leaf) Start(ctx context.Context) error {
	go l.srv.Start()
	if !l.srv.ReadyForConnections(10 * time.Second) {
		l.Shutdown()
		if err := l.log.fatal(); err != nil {
			return err
		}
		return errors.New("the leaf server did not start")
	}
	for l.srv.NumLeafNodes() == 0 {
		select {
		case <-ctx.Done():
			l.Shutdown()
			why := l.log.lastError()
			if why == "" {
				why = ctx.Err().Error()
			}
			return fmt.Errorf("could not join %s as a leaf node: %s", l.cfg.URL, strings.TrimSpace(why))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Connect opens an in-process client connection to the leaf server.
func (l *Leaf) Connect(opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect("", append([]nats.Option{nats.InProcessServer(l.srv)}, opts...)...)
}

// Shutdown stops the server; it is safe to call more than once.
func (l *Leaf) Shutdown() {
	l.shutdownOnce.Do(func() {
		l.srv.Shutdown()
		l.srv.WaitForShutdown()
	})
}
