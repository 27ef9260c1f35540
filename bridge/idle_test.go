package bridge

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
)

// A connection that waits for its next request is closed after a while:
// one refused request, and the caller kept its connection for good (any
// number of them, each a descriptor of the coordinator's). Not parallel:
// it shortens the package's wait.
func TestEndpointClosesIdleConnections(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = time.Second
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMCP(MCPConfig{Client: f})
	ctx, cancel := context.WithCancel(t.Context())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- m.ListenHTTP(ctx, "127.0.0.1:0", HTTPConfig{Token: "secret"}, func(u string) { urls <- u })
	}()
	defer func() { cancel(); <-done }()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		done <- err
		t.Fatal(err)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), MCPPath)
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// (A refusal of who calls closes its connection at once.)
	io.WriteString(c, "GET /nothing-here HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	rep, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rep.Body)
	if rep.StatusCode != http.StatusNotFound || rep.Close {
		t.Fatalf("a request for nothing: %d, close %v; want 404, kept alive", rep.StatusCode, rep.Close)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the idle connection: read %d, %v; want it closed by the endpoint (EOF)", n, err)
	}
}
