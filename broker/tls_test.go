package broker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/tlstest"
)

func TestTLSClients(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "fabric")
	srv := ca.Issue(t, "server")
	b := natstest.Start(t, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{Cert: srv.Cert, Key: srv.Key, CA: ca.File}
	})
	if !strings.HasPrefix(b.ClientURL(), "tls://") {
		t.Fatalf("client URL %s does not say TLS", b.ClientURL())
	}
	nc := natstest.Connect(t, b, nats.RootCAs(ca.File))
	if !nc.IsConnected() {
		t.Fatal("a client trusting the CA is not connected")
	}
	if _, err := nats.Connect(b.ClientURL(), nats.RootCAs(tlstest.NewCA(t, "other").File)); err == nil ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("a client trusting another CA: %v", err)
	}
	in, err := b.Connect()
	if err != nil {
		t.Fatalf("in-process connection: %v", err)
	}
	in.Close()
}

func TestTLSClientCertificates(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "fabric")
	srv, cli := ca.Issue(t, "server"), ca.Issue(t, "cli")
	b := natstest.Start(t, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{Cert: srv.Cert, Key: srv.Key, CA: ca.File, VerifyClients: true}
	})
	if _, err := nats.Connect(b.ClientURL(), nats.RootCAs(ca.File)); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	stranger := tlstest.NewCA(t, "stranger").Issue(t, "cli")
	if _, err := nats.Connect(b.ClientURL(), nats.RootCAs(ca.File), nats.ClientCert(stranger.Cert, stranger.Key)); err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	natstest.Connect(t, b, nats.RootCAs(ca.File), nats.ClientCert(cli.Cert, cli.Key))
}

// A bad certificate stops the server before it starts, naming the file.
func TestBadCertificates(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "fabric")
	good, other := ca.Issue(t, "good"), ca.Issue(t, "other")
	expired := ca.IssueExpired(t, "old")
	notPEM := filepath.Join(t.TempDir(), "junk.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	cases := []struct {
		name string
		tls  broker.TLSConfig
		want []string
	}{
		{"missing", broker.TLSConfig{Cert: "/nonexistent/cert.pem", Key: good.Key}, []string{"/nonexistent/cert.pem", "no such file"}},
		{"not PEM", broker.TLSConfig{Cert: notPEM, Key: good.Key}, []string{notPEM, "not PEM"}},
		{"mismatched key", broker.TLSConfig{Cert: good.Cert, Key: other.Key}, []string{good.Cert, "private key does not match"}},
		{"expired", broker.TLSConfig{Cert: expired.Cert, Key: expired.Key}, []string{expired.Cert, "expired"}},
		{"CA not PEM", broker.TLSConfig{Cert: good.Cert, Key: good.Key, CA: notPEM}, []string{"CA", notPEM}},
	}
	for _, c := range cases {
		_, err := broker.New(broker.Config{Port: -1, StoreDir: t.TempDir(), TLS: c.tls})
		if err == nil {
			t.Errorf("%s: the server was configured", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %q", c.name, err, w)
			}
		}
	}
}
