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
// sessions are bounded, and a client killed without ending its sessions
// does not lock its credentials out: past the bound an initialize ends
// the least recently used session of the same credentials, never
// another's. A session is its credentials' own.
func TestMCPBoundsEachCallersSessions(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{Token: "driver", ObserverToken: "watcher"})
	list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	code, driver, body := post(t, fb.url, "driver", "", []byte(initialize))
	if code != http.StatusOK {
		t.Fatalf("the full token's initialize: %d %s", code, body)
	}
	const made = 1000 // the bound of a token's sessions
	var sessions []string
	for n := range made {
		code, session, body := post(t, fb.url, "watcher", "", []byte(initialize))
		if code != http.StatusOK {
			t.Fatalf("initialize %d: %d %s", n+1, code, body)
		}
		sessions = append(sessions, session)
	}
	// The first is used again: the second is now the least recently used.
	first := sessions[0]
	if code, _, body := post(t, fb.url, "watcher", first, list); code != http.StatusOK {
		t.Fatalf("the observer using its first session: %d %s", code, body)
	}
	for n := range 3 {
		code, session, body := post(t, fb.url, "watcher", "", []byte(initialize))
		if code != http.StatusOK {
			t.Fatalf("initialize %d past the bound: %d %s", n+1, code, body)
		}
		sessions = append(sessions, session)
	}
	for i, s := range sessions[1:4] {
		if code, _, body := post(t, fb.url, "watcher", s, list); code != http.StatusNotFound {
			t.Errorf("session %d, ended for a later one: %d %s, want 404", i+2, code, body)
		}
	}
	for _, s := range []string{first, sessions[4], sessions[len(sessions)-1]} {
		if code, _, body := post(t, fb.url, "watcher", s, list); code != http.StatusOK {
			t.Errorf("a session not the least recently used: %d %s", code, body)
		}
	}
	if code, _, body := post(t, fb.url, "driver", driver, list); code != http.StatusOK {
		t.Errorf("the full token's session after the observer's went past its bound: %d %s", code, body)
	}
	// An initialize carrying a session header begins a session too, and
	// is held to the same bound. A stream is opened on a session only.
	if code, session, body := post(t, fb.url, "watcher", "bogus", []byte(initialize)); code != http.StatusOK {
		t.Errorf("an initialize with a session header: %d %s %s", code, session, body)
	} else if code, _, _ := post(t, fb.url, "watcher", sessions[5], list); code != http.StatusNotFound {
		t.Errorf("the least recently used session after an initialize with a session header: %d, want 404 (ended)", code)
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
	if code := get("driver", first); code != http.StatusNotFound {
		t.Errorf("the full token opening a stream on the observer's session: %d, want 404", code)
	}
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
	code, person, body := post(t, fb.url, "", "", []byte(initialize))
	if code != http.StatusOK {
		t.Fatalf("the person's initialize after a page's GETs: %d %s", code, body)
	}
	var greedy []string
	for n := range 1100 {
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
			t.Fatalf("the agent's initialize %d: %d %s", n+1, rep.StatusCode, b)
		}
		greedy = append(greedy, rep.Header.Get("Mcp-Session-Id"))
	}
	// The agent holds its own bound (16) of them, the latest.
	list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	useAs := func(agent, session string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, fb.url, bytes.NewReader(list))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(schemas.AgentIDHeader, agent)
		req.Header.Set("Mcp-Session-Id", session)
		rep, err := oneShot.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, rep.Body)
		rep.Body.Close()
		return rep.StatusCode
	}
	if code := useAs("greedy", greedy[len(greedy)-16]); code != http.StatusOK {
		t.Errorf("the agent's 16th latest session: %d", code)
	}
	if code := useAs("greedy", greedy[len(greedy)-17]); code != http.StatusNotFound {
		t.Errorf("the agent's 17th latest session: %d, want 404 (ended)", code)
	}
	if code, _, body := post(t, fb.url, "", person, list); code != http.StatusOK {
		t.Fatalf("the person's session after an agent's initializes: %d %s", code, body)
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
