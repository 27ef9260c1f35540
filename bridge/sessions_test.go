package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/schemas"
)

// oneShot sends each request on a connection of its own, closed after
// it, so no kept-alive connection of these tests outlives the endpoint
// (a CI run's goroutine check once found one, client and server side,
// after the package's tests).
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// request sends a request to the endpoint with token (and session, when
// set), and returns the status, the session the answer names and its
// body; a stream's answer is read for at most two seconds after its
// headers. The request itself has a minute: a CI run's loaded cores
// once took more than two seconds to send a 40 MiB body the endpoint
// refuses, and how long it takes is no part of what is tested.
func request(t *testing.T, method, url, token, session string, body []byte) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	rep, err := oneShot.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Body.Close()
	if strings.HasPrefix(rep.Header.Get("Content-Type"), "text/event-stream") {
		defer time.AfterFunc(2*time.Second, cancel).Stop()
	}
	b, _ := io.ReadAll(rep.Body)
	return rep.StatusCode, rep.Header.Get("Mcp-Session-Id"), string(b)
}

// post is request with POST.
func post(t *testing.T, url, token, session string, body []byte) (int, string, string) {
	t.Helper()
	return request(t, http.MethodPost, url, token, session, body)
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// Every MCP session costs the endpoint memory until its client ends it,
// and a client need not: a holder of the observer's token alone made
// 220,000 in 75 s and the coordinator held 2.5 GB. Each principal's
// sessions are bounded, one's bound takes nothing from another's, an
// ended session frees its place, and a session is its credentials' own.
func TestMCPBoundsEachCallersSessions(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{Token: "driver", ObserverToken: "watcher"})
	var first string
	n := 0
	for ; n < 5000; n++ {
		code, session, body := post(t, fb.url, "watcher", "", []byte(initialize))
		if code != http.StatusOK {
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "sessions are open under these credentials") {
				t.Fatalf("initialize %d: %d %s", n+1, code, body)
			}
			t.Logf("initialize %d: %d %s", n+1, code, strings.TrimSpace(body))
			break
		}
		if first == "" {
			first = session
		}
	}
	if n == 5000 || n < 100 {
		t.Fatalf("the observer's token began %d sessions before a refusal; want a bound of some hundreds", n)
	}
	// Past the bound, nothing else begins one: an initialize carrying a
	// session header. A stream is opened on a session only.
	if code, session, body := post(t, fb.url, "watcher", "bogus", []byte(initialize)); code != http.StatusServiceUnavailable {
		t.Errorf("an initialize with a session header past the bound: %d %s %s", code, session, body)
	}
	get := func(token, session string) int {
		t.Helper()
		code, _, _ := request(t, http.MethodGet, fb.url, token, session, nil)
		return code
	}
	if code := get("watcher", ""); code != http.StatusBadRequest {
		t.Errorf("a stream opened without a session: %d, want 400", code)
	}
	if code := get("watcher", "shoal-mcp-made-up"); code != http.StatusNotFound {
		t.Errorf("a stream opened on a session nobody began: %d", code)
	}
	if code, _, body := post(t, fb.url, "driver", "", []byte(initialize)); code != http.StatusOK {
		t.Fatalf("the full token's initialize while the observer's are all taken: %d %s", code, body)
	}
	if code := get("driver", first); code != http.StatusNotFound {
		t.Errorf("the full token opening a stream on the observer's session: %d, want 404", code)
	}
	list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if code, _, body := post(t, fb.url, "driver", first, list); code != http.StatusNotFound {
		t.Errorf("the full token using the observer's session: %d %s, want 404 (not its session)", code, body)
	}
	if code, _, body := post(t, fb.url, "watcher", first, list); code != http.StatusOK {
		t.Fatalf("the observer using its session: %d %s", code, body)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, fb.url, nil)
	req.Header.Set("Authorization", "Bearer watcher")
	req.Header.Set("Mcp-Session-Id", first)
	rep, err := oneShot.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rep.Body.Close()
	if rep.StatusCode != http.StatusOK {
		t.Fatalf("ending a session: %d", rep.StatusCode)
	}
	if code, _, body := post(t, fb.url, "watcher", "", []byte(initialize)); code != http.StatusOK {
		t.Fatalf("initialize after a session ended: %d %s", code, body)
	}
	if code, _, _ := post(t, fb.url, "watcher", first, list); code != http.StatusNotFound {
		t.Errorf("the ended session answered %d, want 404", code)
	}
}

// A request's body is bounded: a holder of the observer's token sent
// 300 MB bodies, each read whole into the coordinator's memory.
func TestMCPBoundsARequestsBody(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{Token: "driver", ObserverToken: "watcher"})
	huge := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"%s"}}`, strings.Repeat("x", 40<<20))
	code, _, body := post(t, fb.url, "watcher", "", huge)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "at most") {
		t.Errorf("a 40 MiB body: %d %.200s, want 413 naming the bound", code, body)
	}
	_, session, _ := post(t, fb.url, "watcher", "", []byte(initialize))
	code, _, body = post(t, fb.url, "watcher", session, fmt.Appendf(nil, `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"pad":"%s"}}`, strings.Repeat("x", 40<<20)))
	if code < 400 {
		t.Errorf("a 40 MiB body in a session: %d %.200s, want a refusal", code, body)
	}
	if code, _, body := post(t, fb.url, "watcher", "", []byte(initialize)); code != http.StatusOK {
		t.Errorf("after the refusals: %d %s", code, body)
	}
}

// On an endpoint without tokens (the default on loopback) one caller
// took every session: a page of any site sent GETs that each began one
// nothing ended (a no-cors GET carries no Origin), and an agent's
// initializes counted as everyone's; the person's initialize was then
// refused for two hours. A stream is opened on a session only, and an
// agent's sessions count as its own.
func TestMCPTokenlessEndpointKeepsOneCallerFromLockingOutEveryone(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	for i := range 1100 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, fb.url, nil)
		req.Header.Set("Accept", "text/event-stream")
		rep, err := oneShot.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rep.Body.Close()
		if rep.StatusCode != http.StatusBadRequest {
			t.Fatalf("GET %d without a session: %d, want 400", i+1, rep.StatusCode)
		}
	}
	if code, _, body := post(t, fb.url, "", "", []byte(initialize)); code != http.StatusOK {
		t.Fatalf("the person's initialize after a page's GETs: %d %s", code, body)
	}
	n := 0
	for ; n < 1100; n++ {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, fb.url, strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(schemas.AgentIDHeader, "greedy")
		rep, err := oneShot.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rep.Body)
		rep.Body.Close()
		if rep.StatusCode != http.StatusOK {
			if rep.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "sessions are open under these credentials") {
				t.Fatalf("the agent's initialize %d: %d %s", n+1, rep.StatusCode, b)
			}
			break
		}
	}
	if n > 16 {
		t.Errorf("one agent began %d sessions on an endpoint without tokens; want its own bound (16)", n)
	}
	if code, _, body := post(t, fb.url, "", "", []byte(initialize)); code != http.StatusOK {
		t.Fatalf("the person's initialize after an agent's: %d %s", code, body)
	}
}

// The MCP library decodes a request whole, into Go values, before any
// tool sees it: 8 MiB of empty objects under a tool call's arguments
// took 449 MiB of the coordinator's memory, from an observer's token. A
// body of more JSON values than any request needs is refused before it
// is decoded.
func TestMCPRefusesARequestOfTooManyValuesUndecoded(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{Token: "driver", ObserverToken: "watcher"})
	_, session, _ := post(t, fb.url, "watcher", "", []byte(initialize))
	var wide bytes.Buffer
	wide.WriteString(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"agent_status","arguments":{"agent_id":"a","pad":[`)
	for wide.Len() < 8<<20 {
		wide.WriteString(`{},`)
	}
	wide.WriteString(`{}]}}}`)
	code, _, body := post(t, fb.url, "watcher", session, wide.Bytes())
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "JSON values") {
		t.Errorf("8 MiB of empty objects in a tool call: %d %.200s; want 413 naming the bound", code, body)
	}
}
