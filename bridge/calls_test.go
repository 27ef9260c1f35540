package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
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
	// The stand-in's subscription reaches the server before the bridge's
	// connection asks it.
	if err := nc.Flush(); err != nil {
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

// agent_job holds a watch while it waits for a job or runs one, and a
// detached job holds its readers after its call has returned, until it
// ends: both count among the caller's calls under way. A person with the
// full token waiting on jobs, or starting detached ones, took readers
// without bound.
func TestMCPCountsJobsAmongTheCallsUnderWay(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.startNode(fake)
	repo := filepath.Join(t.TempDir(), "repo")
	gittest.Git(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	_, js := natstest.JetStream(t, fb.b)
	jobs, err := js.KeyValue(t.Context(), schemas.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	putJob := func(id string, status schemas.JobStatus) error {
		now := float64(time.Now().UnixNano()) / 1e9
		b, _ := json.Marshal(schemas.JobRecord{ID: id, Status: status, Repo: repo, Turns: []string{"x"}, StartedAt: now, Beat: now})
		_, err := jobs.Put(t.Context(), id, b)
		return err
	}
	// Job held goes on, its runner beating, until the test ends it.
	for id, status := range map[string]schemas.JobStatus{"done": schemas.JobSucceeded, "held": schemas.JobRunning} {
		if err := putJob(id, status); err != nil {
			t.Fatal(err)
		}
	}
	beating, stopBeating := context.WithCancel(t.Context())
	var beat sync.WaitGroup
	beat.Go(func() {
		for {
			select {
			case <-beating.Done():
				return
			case <-time.After(5 * time.Second):
				putJob("held", schemas.JobRunning)
			}
		}
	})
	defer beat.Wait()
	defer stopBeating()
	person := fb.client(nil)

	// A detached job whose turn does not end.
	fake.Script(fakemodel.Reply{Text: "Working", Hang: true})
	var started schemas.JobRecord
	ok(t, person, "agent_job", map[string]any{"cwd": repo, "prompt": "Work.", "permission": "bypass", "detach": true}, &started)
	// Waits on a job that goes on: with the detached job, 64 are under
	// way, and those past them are refused at once.
	var waiting sync.WaitGroup
	results := make(chan string, 100)
	const tries = 70
	for range tries {
		waiting.Go(func() {
			res, err := person.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_job", Arguments: map[string]any{"job_id": "held"}})
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
	for refused := 0; refused < tries-63; refused++ {
		select {
		case text := <-results:
			if !strings.Contains(text, "agent_job refused: 64 calls under these credentials are under way") {
				t.Fatalf("a wait past the bound: %q", text)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d waits refused in a minute; want all but 63, beside the detached job", refused, tries)
		}
	}
	if text, isErr := call(t, person, "agent_job", map[string]any{"job_id": "done"}); !isErr || !strings.Contains(text, "64 calls under these credentials are under way") {
		t.Errorf("a wait at the bound: %q", text)
	}
	// The detached job ends once its turn is interrupted; its place is
	// free again.
	poll.Until(t, time.Minute, "the detached job's turn runs", func() bool {
		text, isErr := call(t, person, "agent_status", map[string]any{"agent_id": started.ID})
		var st schemas.AgentRecord
		return !isErr && json.Unmarshal([]byte(text), &st) == nil && st.Status == schemas.StatusWorking
	})
	call(t, person, "agent_interrupt", map[string]any{"agent_id": started.ID})
	poll.Until(t, time.Minute, "a wait beside 63 others once the detached job ended", func() bool {
		text, isErr := call(t, person, "agent_job", map[string]any{"job_id": "done"})
		return !isErr && strings.Contains(text, `"status":"succeeded"`)
	})
	stopBeating()
	beat.Wait()
	if err := putJob("held", schemas.JobSucceeded); err != nil {
		t.Fatal(err)
	}
	waiting.Wait()
	close(results)
	for text := range results {
		if strings.Contains(text, "refused") {
			t.Errorf("a wait within the bound: %q", text)
		}
	}
}
