package client_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// olderNode is a client of a fabric holding agent "aged", opened on a
// repository whose git ignores .env, on node "old", and a stand-in for
// that node answering verb as a node of an earlier version does: a
// request naming excludes is refused the way its schema check refuses an
// unknown parameter, any other is answered with answer. The client is
// made with cfg. It returns the
// requests the stand-in was sent.
func olderNode(t *testing.T, cfg client.Config, verb schemas.Verb, answer any) (*client.Direct, func() []string) {
	t.Helper()
	srv := natstest.Start(t)
	f, err := client.NewDirect(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	repo := gittest.Repo(t, "a.txt", "a\n")
	os.WriteFile(filepath.Join(repo, ".git", "info", "exclude"), []byte(".env\n"), 0o644)
	_, js := natstest.JetStream(t, srv)
	agents, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	rec := schemas.AgentRecord{ID: "aged", Node: "old", Status: schemas.StatusIdle, Model: "sonnet", CWD: repo, CreatedAt: now, LastActivity: now, EventLog: "aged.jsonl",
		Workspace: &schemas.Workspace{Repo: "r1", Source: repo, Base: strings.Repeat("a", 40), Commit: strings.Repeat("a", 40)}}
	b, _ := json.Marshal(rec)
	if _, err := agents.Create(t.Context(), "aged", b); err != nil {
		t.Fatal(err)
	}
	asked := earlierVersion(t, srv, schemas.ControlSubject("old", verb), func(req map[string]any) any {
		if _, ok := req["excludes"]; ok {
			return schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid %s request: Unknown parameter(s): excludes. Valid parameters are: agent_id, stat", verb)}
		}
		return answer
	})
	return f, asked
}

// earlierVersion is a stand-in for a peer of an earlier version serving
// subject on srv: each request is answered with what answer makes of its
// arguments. It returns the requests it was sent.
func earlierVersion(t *testing.T, srv *broker.Broker, subject string, answer func(req map[string]any) any) func() []string {
	t.Helper()
	var mu sync.Mutex
	var asked []string
	old := natstest.Connect(t, srv)
	if _, err := old.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		asked = append(asked, string(m.Data))
		mu.Unlock()
		var req map[string]any
		json.Unmarshal(m.Data, &req)
		out, _ := json.Marshal(answer(req))
		m.Respond(out)
	}); err != nil {
		t.Fatal(err)
	}
	old.Flush()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked)
	}
}

// A node of an earlier version refuses a request naming what the
// person's git ignores (it checks every argument against its schema,
// which has no excludes): the diff is asked for again without them, and
// shows what that node shows, not the refusal.
func TestDiffAsksANodeOfAnEarlierVersionAgainWithoutExcludes(t *testing.T) {
	t.Parallel()
	f, asked := olderNode(t, client.Config{}, schemas.VerbDiff, schemas.DiffReply{Diff: "diff --git a/a.txt b/a.txt\n", Base: strings.Repeat("a", 40), Files: 1})
	got, err := f.Diff(t.Context(), "aged", false)
	if err != nil {
		t.Fatalf("the diff from a node of an earlier version: %v", err)
	}
	if a := asked(); got.Files != 1 || len(a) != 2 || !strings.Contains(a[0], `".env`) || strings.Contains(a[1], "excludes") {
		t.Errorf("the diff %+v, asked %d times: %q", got, len(a), a)
	}
}

// A fetch is asked again the same way, and the person told that what
// their git ignores comes back: what the caller then hears is the node's
// answer to the second request (here, that it has no work to send), not
// the refusal of the first.
func TestFetchAsksANodeOfAnEarlierVersionAgainWithoutExcludes(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var said []string
	cfg := client.Config{Progress: func(s string) { mu.Lock(); said = append(said, s); mu.Unlock() }}
	f, asked := olderNode(t, cfg, schemas.VerbWork, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeUnavailable, "agent aged's checkout is being cleaned")})
	_, err := f.Fetch(t.Context(), "aged", "", false)
	if err == nil || !strings.Contains(err.Error(), "checkout is being cleaned") || schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Errorf("a fetch from a node of an earlier version: %v, want the node's answer to the request without excludes", err)
	}
	if a := asked(); len(a) != 2 || !strings.Contains(a[0], `".env`) || strings.Contains(a[1], "excludes") {
		t.Errorf("the node was asked %d times: %q", len(a), a)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(said) != 1 || !strings.Contains(said[0], "node old is of an earlier version") || !strings.Contains(said[0], "comes back with it") {
		t.Errorf("the person was told %q", said)
	}
}
