package bridge_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
)

// Each body the endpoint reads costs it many times its bytes while it is
// decoded, whatever the call turns out to be (a 14 MB body of junk
// arguments took 170 MiB of heap before it was refused as an unknown
// parameter), so one caller with the least of rights sending many at
// once took gigabytes. The bodies one caller has in flight are bounded:
// while the observer's 14 MB request is being read, its second large one
// is refused at once (503, Retry-After) naming the bound, before a byte of
// it is read; another principal's call goes through meanwhile; and once
// the first is answered, the observer may send again.
func TestMCPHoldsOneCallersBodiesInFlightToABound(t *testing.T) {
	fb := startFabric(t, bridge.HTTPConfig{Token: "full-token", ObserverToken: "observer-token"})
	big := func(body io.Reader) *http.Request {
		r, err := http.NewRequestWithContext(t.Context(), http.MethodPost, fb.url, body)
		if err != nil {
			t.Fatal(err)
		}
		r.ContentLength = 14 << 20
		r.Header.Set("Authorization", "Bearer observer-token")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		return r
	}
	// The first: half sent, the rest held back.
	pr, pw := io.Pipe()
	first := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(big(pr))
		if err != nil {
			t.Errorf("the first large request: %v", err)
		}
		first <- resp
	}()
	head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"agent_status","arguments":{"agent_id":"a1","x":"`
	if _, err := io.WriteString(pw, head+strings.Repeat("a", 7<<20)); err != nil {
		t.Fatal(err)
	}
	// The second, while the first is read.
	resp, err := http.DefaultClient.Do(big(strings.NewReader(strings.Repeat(" ", 14<<20))))
	if err != nil {
		t.Fatal(err)
	}
	said, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(said), "requests being read already") {
		t.Errorf("a second large request while the first is read: %d %q", resp.StatusCode, said)
	}
	// Another principal is not held up by the observer's.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	full := fb.client(map[string]string{"Authorization": "Bearer full-token"})
	if _, err := full.CallTool(ctx, &mcp.CallToolParams{Name: "agent_list", Arguments: map[string]any{}}); err != nil {
		t.Errorf("the full token's call while the observer's body is read: %v", err)
	}
	// The first ends; it is answered, and the observer may send again.
	rest := 14<<20 - len(head) - 7<<20
	io.WriteString(pw, strings.Repeat("a", rest-4)+`"}}}`)
	pw.Close()
	if r := <-first; r != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	observer := fb.client(map[string]string{"Authorization": "Bearer observer-token"})
	if _, err := observer.CallTool(ctx, &mcp.CallToolParams{Name: "agent_list", Arguments: map[string]any{}}); err != nil {
		t.Errorf("the observer's call once its large one was answered: %v", err)
	}
}

// A body is held to its caller's bound while it is read and its call's
// arguments checked, not for the call's whole run: a caller with three
// turns of 7 MiB prompts running (agent_run waits for each) sends a
// fourth, which with the three still counted would pass its 24 MiB.
func TestMCPGivesABodyBackOnceItsCallRuns(t *testing.T) {
	fb := startFabric(t, bridge.HTTPConfig{Token: "full-token"})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	s := fb.client(map[string]string{"Authorization": "Bearer full-token"})
	prompt := "stall " + strings.Repeat("p", 7<<20)
	ids := make([]string, 4)
	for i := range ids {
		text, isErr := call(t, s, "agent_open", map[string]any{"cwd": t.TempDir()})
		if isErr {
			t.Fatalf("open: %s", text)
		}
		var rep struct {
			AgentID string `json:"agent_id"`
		}
		json.Unmarshal([]byte(text), &rep)
		ids[i] = rep.AgentID
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var running sync.WaitGroup
	defer running.Wait()
	defer func() {
		for _, id := range ids {
			call(t, s, "agent_interrupt", map[string]any{"agent_id": id})
		}
	}()
	for _, id := range ids[:3] {
		running.Go(func() {
			s.CallTool(ctx, &mcp.CallToolParams{Name: "agent_run", Arguments: map[string]any{"agent_id": id, "text": prompt}})
		})
	}
	for _, id := range ids[:3] {
		// Three prompts of 7 MiB each decoded under -race on a loaded
		// machine took more than a minute.
		poll.Until(t, 3*time.Minute, "agent "+id+"'s turn runs", func() bool {
			text, _ := call(t, s, "agent_status", map[string]any{"agent_id": id})
			return strings.Contains(text, `"status":"working"`)
		})
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "agent_send", Arguments: map[string]any{"agent_id": ids[3], "text": prompt}})
	if err != nil || res.IsError {
		t.Errorf("a fourth prompt of 7 MiB while three calls with theirs run: %v %+v", err, res)
	}
}
