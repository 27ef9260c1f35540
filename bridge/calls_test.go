package bridge_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A reading tool's call under way holds a JetStream consumer (agent_run
// a watch of the agent's record, a read its stream's), and a stream has
// at most 1,000 for everyone: an agent making calls that wait (agent_run
// on a turn that does not end) took every reader of the fabric. The
// reading calls one agent has under way are bounded, a call past the
// bound is refused at once naming it, nobody else's calls wait on it,
// and the agent may still interrupt what it runs.
func TestMCPBoundsEachCallersCallsUnderWay(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	nested := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &nested, false)
	work := t.TempDir()
	putRecord(t, fb, schemas.AgentRecord{ID: "boss", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(work)})
	putRecord(t, fb, schemas.AgentRecord{ID: "kid", Status: schemas.StatusIdle, Node: "n9", Parent: "boss", Depth: 1, Policy: free.Record(work)})
	// Node n9 takes every turn and answers none until told.
	nc := natstest.Connect(t, fb.b)
	held := make(chan *nats.Msg, 1000)
	if _, err := nc.ChanSubscribe(schemas.ControlSubject("n9", schemas.VerbRun), held); err != nil {
		t.Fatal(err)
	}
	boss := fb.client(map[string]string{schemas.AgentIDHeader: "boss"})
	var running sync.WaitGroup
	results := make(chan string, 100)
	const tries = 40
	for range tries {
		running.Go(func() {
			res, err := boss.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_run", Arguments: map[string]any{"agent_id": "kid", "text": "go on"}})
			switch {
			case err != nil:
				results <- err.Error()
			case len(res.Content) != 1:
				results <- fmt.Sprintf("%d content blocks", len(res.Content))
			default:
				results <- res.Content[0].(*mcp.TextContent).Text
			}
		})
	}
	// Those past the bound are refused at once; the others wait.
	var refused []string
	for len(refused) < tries-16 {
		select {
		case text := <-results:
			if !strings.Contains(text, "agent_run refused: 16 calls of agent boss are under way, the most one agent may make at once") {
				t.Fatalf("a call past the bound: %q", text)
			}
			refused = append(refused, text)
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d calls refused in a minute; want all but the bound's 16", len(refused), tries)
		}
	}
	// Meanwhile the agent's other reads are refused too, and a person's
	// are not; what holds no reader is not bounded.
	if text, isErr := call(t, boss, "agent_output", map[string]any{"agent_id": "kid"}); !isErr || !strings.Contains(text, "16 calls of agent boss are under way") {
		t.Errorf("agent_output by the agent at its bound: %q", text)
	}
	if text, isErr := call(t, boss, "agent_open", map[string]any{"cwd": work, "id": "kid2"}); !isErr || !strings.Contains(text, "16 calls of agent boss are under way") {
		t.Errorf("agent_open by the agent at its bound: %q", text)
	}
	if text, _ := call(t, boss, "agent_status", map[string]any{"agent_id": "kid"}); strings.Contains(text, "refused") {
		t.Errorf("agent_status by the agent at its bound: %q", text)
	}
	person := fb.client(nil)
	var st schemas.AgentRecord
	ok(t, person, "agent_status", map[string]any{"agent_id": "kid"}, &st)
	// The node answers; the waiting calls end, and the agent's next call
	// is served.
	deadline := time.After(time.Minute)
	for answered := 0; answered < 16; answered++ {
		select {
		case m := <-held:
			m.Respond([]byte(`{"stop_reason":"end_turn","text":"done"}`))
		case <-deadline:
			t.Fatalf("the node was asked %d turns; want 16", answered)
		}
	}
	running.Wait()
	close(results)
	for text := range results {
		if strings.Contains(text, "refused") {
			t.Errorf("a call within the bound: %q", text)
		}
	}
	ok(t, boss, "agent_status", map[string]any{"agent_id": "kid"}, &st)
	select {
	case m := <-held:
		t.Errorf("the node was asked a turn past the bound: %s", m.Data)
	default:
	}
}
