package bridge_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// Over MCP, a person opens a real claude agent on a repository of the
// endpoint's machine (agent_open with repo), its Bash tool adds a file,
// agent_diff shows it and agent_fetch makes branch shoal/<id> with it, the
// checkout untouched. An observer reads the diff but fetches nothing; an
// agent may neither open on a repository nor fetch; bad arguments are
// refused in a line each.
func TestMCPWorksOnARepository(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{Token: "full", ObserverToken: "eyes"})
	fb.startNode(fake)
	repo := filepath.Join(t.TempDir(), "repo")
	gittest.Git(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	head := gittest.Git(t, repo, "rev-parse", "HEAD")

	person := fb.client(map[string]string{"Authorization": "Bearer full"})
	var opened schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": repo, "repo": true, "permission": "bypass"}, &opened)
	var rec schemas.AgentRecord
	ok(t, person, "agent_status", map[string]any{"agent_id": opened.AgentID}, &rec)
	if rec.Workspace == nil || rec.Workspace.Base != head || rec.Workspace.Branch != "shoal/"+opened.AgentID || rec.CWD == repo {
		t.Fatalf("the agent's record: %+v", rec)
	}
	in, _ := json.Marshal(map[string]string{"command": "echo from-mcp > mcp.txt", "description": "write"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	var ran schemas.RunReply
	ok(t, person, "agent_run", map[string]any{"agent_id": opened.AgentID, "text": "Write mcp.txt."}, &ran)
	if ran.Text != "Written." {
		t.Fatalf("the run: %+v", ran)
	}

	observer := fb.client(map[string]string{"Authorization": "Bearer eyes"})
	var diff schemas.DiffReply
	ok(t, observer, "agent_diff", map[string]any{"agent_id": opened.AgentID}, &diff)
	if diff.Files != 1 || diff.Base != head || !strings.Contains(diff.Diff, "+from-mcp") || !strings.Contains(diff.Diff, "mcp.txt") {
		t.Errorf("agent_diff: %+v", diff)
	}
	ok(t, observer, "agent_diff", map[string]any{"agent_id": opened.AgentID, "stat": true}, &diff)
	if !strings.Contains(diff.Diff, "mcp.txt | 1 +") {
		t.Errorf("agent_diff with stat: %q", diff.Diff)
	}
	if text, isErr := call(t, observer, "agent_fetch", map[string]any{"agent_id": opened.AgentID}); !isErr || !strings.Contains(text, "rule observer") {
		t.Errorf("an observer's agent_fetch: %q", text)
	}

	var got schemas.FetchReply
	ok(t, person, "agent_fetch", map[string]any{"agent_id": opened.AgentID}, &got)
	if got.Branch != "shoal/"+opened.AgentID || got.Into != repo || got.Files != 1 || got.Base != head {
		t.Errorf("agent_fetch: %+v", got)
	}
	if file := gittest.Git(t, repo, "show", got.Branch+":mcp.txt"); file != "from-mcp" {
		t.Errorf("mcp.txt on %s: %q", got.Branch, file)
	}
	if gittest.Git(t, repo, "rev-parse", "HEAD") != head || gittest.Git(t, repo, "status", "--porcelain") != "" {
		t.Error("the fetch touched the checkout")
	}

	// An agent, even one with every tool, neither reads a repository of
	// this machine nor writes into one.
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "a", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(t.TempDir())})
	agent := fb.client(map[string]string{schemas.AgentIDHeader: "a", "Authorization": "Bearer full"})
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"agent_open", map[string]any{"cwd": repo, "repo": true}},
		{"agent_fetch", map[string]any{"agent_id": opened.AgentID}},
	} {
		if text, isErr := call(t, agent, c.tool, c.args); !isErr || !strings.Contains(text, c.tool+" refused: agent a may not") || !strings.Contains(text, "rule callers-files") {
			t.Errorf("an agent's %s: %q", c.tool, text)
		}
	}

	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"agent_open", map[string]any{"cwd": "repo", "repo": true}, `cwd "repo" is not an absolute path`},
		{"agent_open", map[string]any{"cwd": t.TempDir(), "repo": true}, "not a git repository"},
		{"agent_open", map[string]any{"cwd": repo, "ref": "main"}, "ref and with_changes go with repo: true"},
		{"agent_open", map[string]any{"cwd": repo, "repo": true, "ref": "no-such-ref"}, "no-such-ref"},
		{"agent_fetch", map[string]any{"agent_id": opened.AgentID, "into": "repo"}, `into "repo" is not an absolute path`},
		{"agent_diff", map[string]any{"agent_id": "nobody"}, "nobody"},
	} {
		if text, isErr := call(t, person, c.tool, c.args); !isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: %q, want an error with %q", c.tool, c.args, text, c.want)
		}
	}
}

// agent_job runs a job on a repository of the endpoint's machine: a real
// claude agent's two turns, its work back as a branch, the agent closed;
// detached, it returns at once and agent_job with job_id waits for it. An
// agent may not run one.
func TestMCPRunsAJob(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.startNode(fake)
	repo := filepath.Join(t.TempDir(), "repo")
	gittest.Git(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gittest.Git(t, repo, "add", ".")
	gittest.Git(t, repo, "commit", "-q", "-m", "first")
	bash := func(command string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": command, "description": "write"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	person := fb.client(nil)

	fake.Script(bash("echo one > one.txt"), fakemodel.Reply{Text: "One."}, bash("echo two > two.txt"), fakemodel.Reply{Text: "Two."})
	var job schemas.JobRecord
	ok(t, person, "agent_job", map[string]any{"cwd": repo, "prompt": "Write one.txt.", "then": []string{"Write two.txt."}, "permission": "bypass"}, &job)
	if job.Status != schemas.JobSucceeded || job.Done != 2 || job.Branch != "shoal/"+job.ID || job.Files != 2 || !strings.Contains(job.Stat, "two.txt | 1 +") || job.Usage == nil {
		t.Fatalf("agent_job: %+v", job)
	}
	for file, want := range map[string]string{"one.txt": "one", "two.txt": "two"} {
		if got := gittest.Git(t, repo, "show", job.Branch+":"+file); got != want {
			t.Errorf("%s on %s: %q", file, job.Branch, got)
		}
	}
	var rec schemas.AgentRecord
	ok(t, person, "agent_status", map[string]any{"agent_id": job.ID}, &rec)
	if rec.Status != schemas.StatusDead {
		t.Errorf("the job's agent after the job: %s", rec.Status)
	}

	fake.Script(bash("echo three > three.txt"), fakemodel.Reply{Text: "Three."})
	var started, ended schemas.JobRecord
	ok(t, person, "agent_job", map[string]any{"cwd": repo, "prompt": "Write three.txt.", "permission": "bypass", "detach": true}, &started)
	if started.Status != schemas.JobRunning || started.ID == "" {
		t.Fatalf("a detached agent_job: %+v", started)
	}
	ok(t, person, "agent_job", map[string]any{"job_id": started.ID}, &ended)
	if ended.Status != schemas.JobSucceeded || gittest.Git(t, repo, "show", ended.Branch+":three.txt") != "three" {
		t.Errorf("the detached job as it ended: %+v", ended)
	}

	// A job whose turn fails is failed, saying why, with its work so far.
	fake.Script(fakemodel.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorMessage: "the prompt is not allowed"})
	ok(t, person, "agent_job", map[string]any{"cwd": repo, "prompt": "Fail.", "permission": "bypass"}, &job)
	if job.Status != schemas.JobFailed || !strings.Contains(job.Error, "the prompt is not allowed") || job.Done != 0 {
		t.Errorf("a failing job: %+v", job)
	}

	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "a", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(t.TempDir())})
	agent := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	if text, isErr := call(t, agent, "agent_job", map[string]any{"cwd": repo, "prompt": "x"}); !isErr || !strings.Contains(text, "rule callers-files") {
		t.Errorf("an agent's agent_job: %q", text)
	}
	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"prompt": "x"}, "a job needs cwd"},
		{map[string]any{"cwd": "repo", "prompt": "x"}, `cwd "repo" is not an absolute path`},
		{map[string]any{"cwd": repo, "prompt": " "}, "a job needs a prompt"},
		{map[string]any{"job_id": started.ID, "prompt": "x"}, "job_id waits for a job: give it alone"},
		{map[string]any{"job_id": "nosuch"}, "no such job: nosuch"},
	} {
		if text, isErr := call(t, person, "agent_job", c.args); !isErr || !strings.Contains(text, c.want) {
			t.Errorf("agent_job %v: %q, want %q", c.args, text, c.want)
		}
	}
}

// agent_run called with a progress token reports the turn's events as
// notifications/progress while it runs, through the official MCP client;
// without one it reports nothing.
func TestMCPRunReportsProgress(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.startNode(fake)
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	c := mcp.NewClient(&mcp.Implementation{Name: "progress-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, r.Params)
			mu.Unlock()
		},
	})
	s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "permission": "bypass"}, &opened)
	in, _ := json.Marshal(map[string]string{"command": "echo hi", "description": "say hi"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Said hi."})
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_run", Meta: mcp.Meta{"progressToken": "tok-1"},
		Arguments: map[string]any{"agent_id": opened.AgentID, "text": "Say hi."}})
	if err != nil || res.IsError {
		t.Fatalf("agent_run: %+v %v", res, err)
	}
	// The client hears of the progress on its own goroutines, which may
	// run after the call has returned.
	var kinds []string
	var steps []float64
	poll.Until(t, 10*time.Second, "the progress of the turn's result", func() bool {
		mu.Lock()
		defer mu.Unlock()
		kinds, steps = nil, nil
		for _, p := range got {
			if p.ProgressToken != "tok-1" {
				t.Errorf("progress with token %v", p.ProgressToken)
			}
			kinds, steps = append(kinds, p.Message), append(steps, p.Progress)
		}
		return slices.Contains(kinds, "result")
	})
	slices.Sort(steps)
	for i, p := range steps {
		if p != float64(i+1) {
			t.Errorf("the progress counts %v, want 1 to %d", steps, len(steps))
			break
		}
	}
	for _, want := range []string{"turn_started", "tool_use", "tool_result", "assistant_text", "result"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("no progress for %s: %v", want, kinds)
		}
	}
	n := len(kinds)
	fake.Script(fakemodel.Reply{Text: "Again."})
	ok(t, s, "agent_run", map[string]any{"agent_id": opened.AgentID, "text": "Again."}, new(schemas.RunReply))
	time.Sleep(time.Second) // what would have been told of it has arrived
	mu.Lock()
	if len(got) != n {
		t.Errorf("a call without a token was told of progress: %d more", len(got)-n)
	}
	mu.Unlock()
}

// agent_run's progress follows the run's own turn: called while another
// turn of the agent runs, it reported the other turn's events and its
// result, and then nothing more of its own. It reports each of its own
// turn's events (its echo among them) through to its own result.
func TestMCPRunReportsProgressOfItsOwnTurn(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.startNode(fake)
	type told struct {
		kind string
		at   time.Time
	}
	var mu sync.Mutex
	var got []told
	c := mcp.NewClient(&mcp.Implementation{Name: "progress-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, told{r.Params.Message, time.Now()})
			mu.Unlock()
		},
	})
	s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: fb.url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var opened schemas.OpenReply
	ok(t, s, "agent_open", map[string]any{"cwd": t.TempDir(), "permission": "bypass"}, &opened)
	// The first turn streams slowly; the run is sent behind it.
	fake.Script(fakemodel.Reply{Text: strings.Repeat("slow ", 40), ChunkSize: 5, Delay: 50 * time.Millisecond}, fakemodel.Reply{Text: "Mine."})
	var first schemas.SendReply
	ok(t, s, "agent_send", map[string]any{"agent_id": opened.AgentID, "text": "The other turn."}, &first)
	var run schemas.RunReply
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_run", Meta: mcp.Meta{"progressToken": "tok-2"},
		Arguments: map[string]any{"agent_id": opened.AgentID, "text": "My turn."}})
	if err != nil || res.IsError {
		t.Fatalf("agent_run: %+v %v", res, err)
	}
	returned := time.Now()
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &run); err != nil || run.Text != "Mine." {
		t.Fatalf("agent_run: %+v %v", res.Content, err)
	}
	poll.Until(t, 10*time.Second, "the progress of the run's result", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(got, func(x told) bool { return x.kind == "result" })
	})
	time.Sleep(500 * time.Millisecond) // what more would be told has come
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, x := range got {
		kinds = append(kinds, x.kind)
	}
	if n := slices.IndexFunc(got, func(x told) bool { return x.kind == "result" }); n != len(got)-1 {
		t.Errorf("the progress told of a result before its last (%v): another turn's", kinds)
	}
	if got[len(got)-1].at.Sub(returned) > 3*time.Second {
		t.Errorf("the result was told of %s after the run returned", got[len(got)-1].at.Sub(returned))
	}
	for _, want := range []string{"user_text", "turn_started", "assistant_text", "result"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("no progress for the run's %s: %v", want, kinds)
		}
	}
	if c := strings.Count(strings.Join(kinds, " "), "user_text"); c != 1 {
		t.Errorf("the progress told of %d user_text (the other turn's echo?): %v", c, kinds)
	}
}
