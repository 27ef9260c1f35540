package client_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node of an earlier version refuses a request naming what the
// person's git ignores (it checks every argument against its schema,
// which has no excludes): the diff is asked for again without them, and
// shows what that node shows, not the refusal.
func TestDiffAsksANodeOfAnEarlierVersionAgainWithoutExcludes(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	f, err := client.NewDirect(nc, client.Config{})
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
	// The earlier node, as its schema check answers.
	var mu sync.Mutex
	var asked []string
	old := natstest.Connect(t, srv)
	if _, err := old.Subscribe(schemas.ControlSubject("old", schemas.VerbDiff), func(m *nats.Msg) {
		mu.Lock()
		asked = append(asked, string(m.Data))
		mu.Unlock()
		var req map[string]any
		json.Unmarshal(m.Data, &req)
		var rep any = schemas.DiffReply{Diff: "diff --git a/a.txt b/a.txt\n", Base: rec.Workspace.Commit, Files: 1}
		if _, ok := req["excludes"]; ok {
			rep = schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid diff request: Unknown parameter(s): excludes. Valid parameters are: agent_id, stat")}
		}
		out, _ := json.Marshal(rep)
		m.Respond(out)
	}); err != nil {
		t.Fatal(err)
	}
	old.Flush()
	got, err := f.Diff(t.Context(), "aged", false)
	if err != nil {
		t.Fatalf("the diff from a node of an earlier version: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Files != 1 || len(asked) != 2 || !strings.Contains(asked[0], `".env`) || strings.Contains(asked[1], "excludes") {
		t.Errorf("the diff %+v, asked %d times: %q", got, len(asked), asked)
	}
}
