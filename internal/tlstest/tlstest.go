// Package tlstest makes throwaway certificate authorities and loopback
// certificates for tests, written as PEM files in the test's temp dir.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority whose files live in Dir.
type CA struct {
	Dir  string
	File string // the CA certificate, PEM

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	n    int64
}

// Pair is a certificate and its key, as PEM files.
type Pair struct {
	Cert, Key string
}

// NewCA makes a CA named name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("tlstest: create CA: %v", err)
	}
	cert, _ := x509.ParseCertificate(der)
	dir := tb.TempDir()
	ca := &CA{Dir: dir, File: filepath.Join(dir, name+"-ca.pem"), cert: cert, key: key, n: 1}
	writePEM(tb, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate for name, valid for 127.0.0.1 and localhost,
// usable by servers and clients alike.
func (ca *CA) Issue(tb testing.TB, name string) Pair {
	tb.Helper()
	return ca.issue(tb, name, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
}

// IssueExpired makes a certificate whose validity ended an hour ago.
func (ca *CA) IssueExpired(tb testing.TB, name string) Pair {
	tb.Helper()
	return ca.issue(tb, name, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
}

func (ca *CA) issue(tb testing.TB, name string, from, to time.Time) Pair {
	key := newKey(tb)
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    from,
		NotAfter:     to,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("tlstest: issue %s: %v", name, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	p := Pair{Cert: filepath.Join(ca.Dir, name+".pem"), Key: filepath.Join(ca.Dir, name+"-key.pem")}
	writePEM(tb, p.Cert, "CERTIFICATE", der)
	writePEM(tb, p.Key, "EC PRIVATE KEY", kb)
	return p
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: key: %v", err)
	}
	return key
}

func writePEM(tb testing.TB, path, kind string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
}
