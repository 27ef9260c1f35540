package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Defaults applied to a zero Config.
const (
	DefaultHost       = "127.0.0.1"
	DefaultPort       = 4222
	DefaultMaxPayload = 8 << 20 // 8 MiB: room for a big tool output or image
)

// Config describes an embedded server. Its zero value runs a standalone
// loopback server on port 4222 with its store in the system temp dir.
type Config struct {
	// Host is the client listen address; DefaultHost when empty. A
	// non-loopback host requires Auth.
	Host string
	// Port is the client port; DefaultPort when zero, a free port when -1.
	Port int
	// StoreDir holds JetStream's files; <temp>/shoal-jetstream when empty.
	StoreDir string
	// ServerName names the server; required in a cluster.
	ServerName string
	// MaxPayload is the largest message the server accepts, in bytes;
	// DefaultMaxPayload when zero.
	MaxPayload int32

	// Cluster joins a NATS cluster when Cluster.Name is set.
	Cluster ClusterConfig
	// Leaf accepts leaf-node connections when Leaf.Port is non-zero.
	Leaf LeafConfig
	// Monitor serves the server's HTTP monitoring endpoints (/varz,
	// /connz, /jsz, …) when Monitor.Port is non-zero. They have no
	// authentication of their own: off loopback they require Auth, as
	// every other listener does.
	Monitor MonitorConfig
	// Auth turns on authentication: every client, leaf node and the
	// server's own connections present credentials the authority issued.
	// Nil means no authentication, which only loopback listeners may have.
	Auth *Authority
	// TLS secures the client, leaf-node and route listeners when its
	// certificate is set.
	TLS TLSConfig

	// Assets sets the stream and bucket limits.
	Assets Assets

	// DontListen serves in-process connections only.
	DontListen bool
	// ReadyTimeout bounds the wait for the server to accept connections;
	// 10s when zero.
	ReadyTimeout time.Duration
	// Logger receives the server's warnings and errors; discarded when nil.
	Logger *slog.Logger
}

// ClusterConfig joins the server to a cluster of NATS servers (routes).
type ClusterConfig struct {
	Name   string   // cluster name, the same on every member
	Host   string   // route listen host; Config.Host when empty
	Port   int      // route listen port; -1 picks a free one
	Routes []string // nats-route://host:port of the other members
}

// LeafConfig accepts leaf-node connections, for machines that can only
// dial out.
type LeafConfig struct {
	Host string // Config.Host when empty
	Port int    // -1 picks a free one
}

// MonitorConfig turns on the server's HTTP monitoring.
type MonitorConfig struct {
	Host string // Config.Host when empty
	Port int    // -1 picks a free one
}

// TLSConfig names the PEM files of a server's TLS identity.
type TLSConfig struct {
	Cert string // the server's certificate (chain)
	Key  string // its private key
	// CA verifies the certificates of peers: cluster routes always, and
	// clients and leaf nodes when VerifyClients is set.
	CA string
	// VerifyClients requires every client and leaf node to present a
	// certificate CA signed.
	VerifyClients bool
}

func (t TLSConfig) enabled() bool { return t.Cert != "" || t.Key != "" || t.CA != "" }

func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.StoreDir == "" {
		c.StoreDir = filepath.Join(os.TempDir(), "shoal-jetstream")
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 10 * time.Second
	}
	if c.Cluster.Host == "" {
		c.Cluster.Host = c.Host
	}
	if c.Leaf.Host == "" {
		c.Leaf.Host = c.Host
	}
	if c.Monitor.Host == "" {
		c.Monitor.Host = c.Host
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Assets = c.Assets.withDefaults()
	return c
}

// validate reports the first problem with a defaulted config.
func (c Config) validate() error {
	if c.Port < -1 || c.Port > 65535 {
		return fmt.Errorf("port %d is out of range (1-65535, or -1 for any free port)", c.Port)
	}
	if c.MaxPayload < 1024 || c.MaxPayload > 64<<20 {
		return fmt.Errorf("max payload %d bytes is out of range (1 KiB to 64 MiB)", c.MaxPayload)
	}
	if !validHost(c.Host) {
		return fmt.Errorf("host %q is not an address to listen on: give an IP address or a host name", c.Host)
	}
	if c.Auth == nil {
		for _, h := range []struct{ what, host string }{
			{"client", c.Host}, {"cluster", c.Cluster.Host}, {"leaf-node", c.Leaf.Host}, {"monitoring", c.Monitor.Host},
		} {
			if (h.what == "cluster" && c.Cluster.Name == "") || (h.what == "leaf-node" && c.Leaf.Port == 0) || (h.what == "monitoring" && c.Monitor.Port == 0) {
				continue
			}
			if !isLoopback(h.host) {
				return fmt.Errorf("refusing to listen for %s connections on %s without authentication: turn authentication on (shoal up --auth), or listen on 127.0.0.1", h.what, h.host)
			}
		}
		if c.Monitor.Port < -1 || c.Monitor.Port > 65535 {
			return fmt.Errorf("monitoring port %d is out of range (1-65535, or -1 for any free port)", c.Monitor.Port)
		}
	}
	if c.TLS.enabled() {
		if c.TLS.Cert == "" || c.TLS.Key == "" {
			return errors.New("TLS needs both a certificate and its key")
		}
		if c.TLS.VerifyClients && c.TLS.CA == "" {
			return errors.New("verifying client certificates needs a CA")
		}
	}
	if c.Cluster.Name != "" && c.ServerName == "" {
		return errors.New("a cluster member needs a server name (unique in the cluster)")
	}
	for _, r := range c.Cluster.Routes {
		if _, err := url.Parse(r); err != nil {
			return fmt.Errorf("route %q: %w", r, err)
		}
	}
	return c.Assets.validate()
}

// isLoopback reports whether host names only this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validHost reports whether host is an IP address or a host name (letters,
// digits, hyphens and dots): what a listener can be given.
func validHost(host string) bool {
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
