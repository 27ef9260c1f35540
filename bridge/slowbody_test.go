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

// listen serves an endpoint with cfg for the test and returns its host.
func listen(t *testing.T, cfg HTTPConfig) string {
	t.Helper()
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMCP(MCPConfig{Client: f})
	ctx, cancel := context.WithCancel(t.Context())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- m.ListenHTTP(ctx, "127.0.0.1:0", cfg, func(u string) { urls <- u }) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case u := <-urls:
		return strings.TrimSuffix(strings.TrimPrefix(u, "http://"), MCPPath)
	case err := <-done:
		done <- err
		t.Fatal(err)
	}
	return ""
}

// A caller that declares a body and never sends it held its connection
// for good, a token or none: the refusal waited for the body the server
// reads before it answers, and a caller with the token held its call's
// read. 20,000 such connections took every descriptor of the
// coordinator, whose store then failed its writes until a restart. A
// refusal is answered at once and closes the connection; a body has
// bodyTimeout to arrive; and the endpoint holds maxConns connections at
// once, of which a caller without a token keeps none: its refusal closes
// the connection, with or without a body. Not parallel: it changes the
// package's bounds.
func TestEndpointHoldsNoConnectionForABodyThatNeverComes(t *testing.T) {
	defer func(d time.Duration, n int) { bodyTimeout, maxConns = d, n }(bodyTimeout, maxConns)
	bodyTimeout, maxConns = 20*time.Second, 3
	host := listen(t, HTTPConfig{Token: "secret"})
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(time.Minute))
		return c
	}
	// Headers of a body that never comes.
	stalled := func(c net.Conn, token string) *http.Response {
		t.Helper()
		auth := ""
		if token != "" {
			auth = "Authorization: Bearer " + token + "\r\n"
		}
		io.WriteString(c, "POST "+MCPPath+" HTTP/1.1\r\nHost: "+host+"\r\n"+auth+"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{")
		rep, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		io.Copy(io.Discard, rep.Body)
		return rep
	}
	closed := func(c net.Conn, within time.Duration, what string) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(within))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("%s: read %d, %v; want the connection closed within %s", what, n, err, within)
		}
	}
	// Refused at once, the connection closed at once: not after the
	// body's time (the server reads none of what is left of it).
	c := dial()
	if rep := stalled(c, ""); rep.StatusCode != http.StatusUnauthorized || !rep.Close {
		t.Errorf("a refusal before the body: %d, close %v; want 401 and the connection closed", rep.StatusCode, rep.Close)
	}
	closed(c, 10*time.Second, "after the refusal")
	// A caller without a token sending requests without bodies keeps no
	// connection either.
	c = dial()
	io.WriteString(c, "GET "+MCPPath+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	if rep, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || rep.StatusCode != http.StatusUnauthorized || !rep.Close {
		t.Errorf("a GET without the token: %v %v; want 401 and the connection closed", rep, err)
	}
	closed(c, 10*time.Second, "after the GET's refusal")
	c = dial()
	if rep := stalled(c, "secret"); rep.StatusCode != http.StatusRequestEntityTooLarge && rep.StatusCode != http.StatusBadRequest {
		t.Errorf("a body that never came, with the token: %d", rep.StatusCode)
	}
	closed(c, time.Minute, "after the body's time")

	// Three connections held: a fourth waits for one of them to close.
	held := []net.Conn{dial(), dial(), dial()}
	for _, h := range held {
		io.WriteString(h, "POST "+MCPPath+" HTTP/1.1\r\nHost: "+host+"\r\n")
	}
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/nothing-here", nil)
		rep, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			answered <- -1
			return
		}
		rep.Body.Close()
		answered <- rep.StatusCode
	}()
	select {
	case code := <-answered:
		t.Fatalf("a request past the bound on connections was answered (%d) while every place was held", code)
	case <-time.After(time.Second):
	}
	held[0].Close()
	select {
	case code := <-answered:
		if code != http.StatusNotFound {
			t.Errorf("the request once a place was free: %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a request waited for good after a place was freed")
	}
}
