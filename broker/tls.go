package broker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// applyTLS secures the client, leaf-node and route listeners. Each file
// is read here first, so a missing or malformed one is reported by name
// rather than deep inside the server.
func applyTLS(opts *server.Options, t TLSConfig) error {
	cert, err := LoadKeyPair(t.Cert, t.Key)
	if err != nil {
		return err
	}
	var pool *x509.CertPool
	if t.CA != "" {
		if pool, err = LoadCA(t.CA); err != nil {
			return err
		}
	}
	base := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		ClientCAs:    pool,
		RootCAs:      pool,
	}
	client := base.Clone()
	if t.VerifyClients {
		client.ClientAuth = tls.RequireAndVerifyClientCert
	}
	opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = client, true, t.VerifyClients, 5
	opts.LeafNode.TLSConfig, opts.LeafNode.TLSTimeout = client.Clone(), 5
	if opts.Cluster.Name != "" {
		if pool == nil {
			return errors.New("TLS between cluster members needs a CA to verify each other's certificates")
		}
		route := base.Clone()
		route.ClientAuth = tls.RequireAndVerifyClientCert
		opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = route, 5
	}
	return nil
}

// LoadKeyPair reads a PEM certificate and its private key, saying which
// file is wrong and how.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if _, err := readPEM(certFile, "certificate"); err != nil {
		return tls.Certificate{}, err
	}
	if _, err := readPEM(keyFile, "private key"); err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %s with key %s: %w", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %s: %w", certFile, err)
	}
	if now := time.Now(); now.After(leaf.NotAfter) {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %s expired on %s", certFile, leaf.NotAfter.Format(time.DateOnly))
	} else if now.Before(leaf.NotBefore) {
		return tls.Certificate{}, fmt.Errorf("TLS certificate %s is not valid before %s", certFile, leaf.NotBefore.Format(time.RFC3339))
	}
	return cert, nil
}

// LoadCA reads a PEM bundle of CA certificates.
func LoadCA(file string) (*x509.CertPool, error) {
	b, err := readPEM(file, "CA certificate")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("TLS CA %s holds no PEM certificate", file)
	}
	return pool, nil
}

// readPEM reads file and checks it holds PEM data.
func readPEM(file, what string) ([]byte, error) {
	if file == "" {
		return nil, fmt.Errorf("TLS %s: no file given", what)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("TLS %s: %w", what, err)
	}
	if block, _ := pem.Decode(b); block == nil {
		return nil, fmt.Errorf("TLS %s %s is not PEM (want -----BEGIN …----- blocks)", what, file)
	}
	return b, nil
}
