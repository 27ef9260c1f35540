// Package freeport hands tests loopback ports for servers they start in
// other processes, or start again on the same port.
package freeport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// handedOut is every port Take has handed out in this test binary.
var handedOut sync.Map

// Take returns a loopback TCP port nothing listened on a moment ago and
// that Take has not handed out before in this test binary.
//
// It is taken below the kernel's ephemeral range (where it can tell it),
// from which the kernel picks a port for every listener on port 0 and
// every outgoing connection: a port picked there and handed to a server
// that binds it a moment later was, now and then, taken meanwhile by
// another test's server listening on port 0 (a cluster's route port,
// once) or another connection's own end. The kernel may also give a port
// it gave a moment ago to the next listener on port 0: of 20,000 runs of
// nine picks in a row, 101 had two alike.
func Take(tb testing.TB) int {
	tb.Helper()
	lo, hi := belowEphemeral()
	for range 1000 {
		port := 0
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			if port == 0 {
				tb.Fatal(err)
			}
			continue // in use
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken {
			return port
		}
	}
	tb.Fatal("freeport: no free loopback port found in 1,000 tries")
	return 0
}

// belowEphemeral is the range [lo, hi) of ports Take picks from: from
// 10,000 up to the kernel's ephemeral range. Empty where the range cannot
// be read (Take then asks for port 0).
func belowEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first <= 11000 {
		return 0, 0
	}
	return 10000, first
}
