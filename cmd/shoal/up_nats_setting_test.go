package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// One setting serves both sides: shoal up listens where `nats` in the
// config file or SHOAL_NATS says, host and scheme included. It took the
// port alone: SHOAL_NATS=nats://0.0.0.0:P (or a LAN address) gave a
// server on 127.0.0.1:P without a word, and tls://127.0.0.1:P a plain one
// that the clients reading the same setting could not reach ("secure
// connection not available"). A host off loopback is then refused without
// --auth, as --host is, and tls:// without a certificate.
func TestUpListensWhereItsNatsSettingSays(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t))
	for _, host := range []string{"0.0.0.0", "192.0.2.10", "localhost"} {
		url := "nats://" + host + ":" + port
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, "config", "up")
		if code != 0 || !regexp.MustCompile(`(?m)^host = "`+regexp.QuoteMeta(host)+`" +# env SHOAL_NATS \(nats\)$`).MatchString(out) {
			// (Fatal: a shoal up that takes the port alone runs.)
			t.Fatalf("SHOAL_NATS=%s: shoal config up exits %d and says:\n%s%s", url, code, out, errOut)
		}
	}
	// Off loopback without --auth: refused, as --host 0.0.0.0 is.
	url := "nats://0.0.0.0:" + port
	code, _, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, "up", "--no-node", "--no-bus", "--no-mcp")
	if code != exitUsage || !strings.Contains(errOut, "0.0.0.0") {
		t.Errorf("SHOAL_NATS=%s: shoal up without --auth exits %d: %s", url, code, errOut)
	}
	url = "tls://127.0.0.1:" + port
	code, _, errOut = runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, "up", "--no-node", "--no-bus", "--no-mcp")
	if code != exitUsage || !strings.Contains(errOut, "env SHOAL_NATS") || !strings.Contains(errOut, "--tls-cert") {
		t.Errorf("SHOAL_NATS=%s: shoal up without a certificate exits %d: %s", url, code, errOut)
	}
}

// With --nats on its command line shoal up uses that external deployment:
// the setting its clients read (SHOAL_NATS=tls://nats.example:4222, as a
// shell exports it for shoal ls and shoal node) says nothing of where it
// listens, and a tls:// one was refused for want of --tls-cert (found by
// an outside review of the change above).
func TestUpWithNatsOnItsCommandLineLeavesTheSettingToClients(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t)) // nothing listens there
	args := []string{"up", "--nats", "nats://127.0.0.1:" + port, "--no-node", "--no-bus", "--no-mcp"}
	for _, env := range []string{"SHOAL_NATS=tls://127.0.0.1:" + port, "SHOAL_NATS=nats://0.0.0.0:" + port} {
		code, _, errOut := runShoal(t, t.TempDir(), []string{env}, args...)
		if strings.Contains(errOut, "SHOAL_NATS") || !strings.Contains(errOut, "cannot reach NATS at nats://127.0.0.1:"+port) {
			t.Errorf("%s shoal %s: exits %d: %s; want it to try the server --nats names", env, strings.Join(args, " "), code, errOut)
		}
	}
}
