package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// A name on a sandboxed agent's list that resolves to this machine's
// loopback, a link-local or the instance-metadata address is refused
// (the answer a rebinding DNS server gives); the same address named on
// the list, or localhost, is let through; and the address checked is the
// one dialled. (A list that names the address itself lets a name that
// resolves to it through: the person who wrote it chose that address.)
func TestProxyRefusesNamesThatResolveInside(t *testing.T) {
	t.Parallel()
	secret, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	go http.Serve(secret, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the node's secret") }))
	port := fmt.Sprint(secret.Addr().(*net.TCPAddr).Port)
	answers := map[string]string{"rebound.test": "127.0.0.1", "metadata.test": "169.254.169.254", "v6.test": "::1", "linklocal.test": "169.254.7.7"}
	// flip.test rebinds: its first answer is an address the list names
	// (where nothing listens), every later one the node's loopback.
	var flips atomic.Int32
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		if host == "flip.test" {
			if flips.Add(1) == 1 {
				return []net.IPAddr{{IP: net.ParseIP("127.0.0.2")}}, nil
			}
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}}, nil
		}
		if a, ok := answers[host]; ok {
			return []net.IPAddr{{IP: net.ParseIP(a)}}, nil
		}
		return net.DefaultResolver.LookupIPAddr(context.Background(), host)
	}
	var allow []string
	for h := range answers {
		allow = append(allow, h+":"+port)
	}
	allow = append(allow, "localhost:"+port, "flip.test:"+port, "127.0.0.2:"+port)
	px, err := startProxyResolving(t.Context(), allow, nil, slog.New(slog.DiscardHandler), lookup)
	if err != nil {
		t.Fatal(err)
	}
	defer px.close()
	get := func(host string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", px.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET http://%s:%s/ HTTP/1.1\r\nHost: %s:%s\r\n\r\n", host, port, host, port)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for host, kind := range map[string]string{"rebound.test": "loopback", "metadata.test": "instance metadata", "v6.test": "loopback", "linklocal.test": "link-local"} {
		if code, body := get(host); code != http.StatusForbidden || !strings.Contains(body, "an address of this machine or its network ("+kind+")") || strings.Contains(body, "secret") {
			t.Errorf("%s: %d %q", host, code, body)
		}
	}
	if code, body := get("localhost"); code != http.StatusOK || body != "the node's secret" {
		t.Errorf("localhost, named on the list: %d %q", code, body)
	}
	if code, _ := get("127.0.0.1"); code != http.StatusForbidden {
		t.Errorf("127.0.0.1, not on the list: %d", code)
	}
	if code, body := get("flip.test"); code == http.StatusOK || strings.Contains(body, "secret") || flips.Load() != 1 {
		t.Errorf("a name that rebinds after its check: %d %q, resolved %d times", code, body, flips.Load())
	}
}
