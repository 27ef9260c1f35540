package bridge

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A connection that waits for its next request is closed after a while:
// one refused request, and the caller kept its connection for good (any
// number of them, each a descriptor of the coordinator's). Not parallel:
// it shortens the package's wait.
func TestEndpointClosesIdleConnections(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = time.Second
	host := listen(t, HTTPConfig{Token: "secret"})
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
