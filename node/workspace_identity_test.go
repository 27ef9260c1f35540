package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// A fetch takes a commit on shoal/<id> for Shoal's only when Shoal's
// identity made it: the node sets it in the agent's checkout, but git
// takes GIT_AUTHOR_EMAIL and the rest from the environment first, and the
// agent had its node's. Started with a person's identity in it, the node
// had the agent's commits made under that person's name: once the agent
// rewrote its history, the fetch took its dropped commit for a person's
// and refused to move past it even when forced. The agent commits as
// itself, sandboxed or not, whatever identity its node runs with, and
// whatever its git's own settings say.
func TestAnAgentCommitsAsItselfWhateverItsNodesIdentity(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	for _, sandboxed := range []bool{false, true} {
		name := "plain"
		if sandboxed {
			name = "sandboxed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fake := fakemodel.Start(t, fakemodel.Config{})
			env := append(peers.ClaudeEnv(t.TempDir(), fake.URL()), "GIT_AUTHOR_NAME=Me", "GIT_AUTHOR_EMAIL=me@corp.example",
				"GIT_COMMITTER_NAME=Me", "GIT_COMMITTER_EMAIL=me@corp.example")
			f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: env, StopWait: time.Second}})
			repo := gittest.Repo(t, "a.txt", "a\n")
			ctx := f.ctx(3 * time.Minute)
			id := "ident-" + name
			if _, err := f.fabric.OpenRepo(ctx, schemas.OpenRequest{ID: id, Permission: "bypass", Sandbox: &sandboxed}, client.RepoSource{Dir: repo}); err != nil {
				t.Fatal(err)
			}
			if rec, err := f.fabric.Status(ctx, id); err != nil || (rec.Sandbox != nil && rec.Sandbox.Kernel != "") != sandboxed {
				t.Fatalf("the agent's sandbox: %+v %v; want sandboxed %v", rec.Sandbox, err, sandboxed)
			}
			fake.Script(
				bash("echo w > w.txt && git add w.txt && git commit -qm 'agent work' && git -c user.name=bot -c user.email=bot@example.com commit -q --allow-empty -m 'more work' && echo committed"),
				fakemodel.Reply{Text: "Committed."},
				bash("git reset -q --hard HEAD~2 && echo v > v.txt && echo reset"),
				fakemodel.Reply{Text: "Reset."},
			)
			if rep, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: id, Text: "Commit."}); err != nil || rep.Text != "Committed." {
				t.Fatalf("turn 1: %+v %v", rep, err)
			}
			if _, err := f.fabric.Fetch(ctx, id, "", false); err != nil {
				t.Fatalf("the first fetch: %v", err)
			}
			who := gittest.Git(t, repo, "log", "--format=%an <%ae>, %cn <%ce>", "main..shoal/"+id)
			want := "shoal agent " + id + " <" + id + "@shoal.invalid>"
			for l := range strings.Lines(who) {
				if strings.TrimSpace(l) != want+", "+want {
					t.Errorf("the agent's commits were made by %q; want %s", who, want)
					break
				}
			}
			if rep, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: id, Text: "Reset."}); err != nil || rep.Text != "Reset." {
				t.Fatalf("turn 2: %+v %v", rep, err)
			}
			if _, err := f.fabric.Fetch(ctx, id, "", false); err == nil || !strings.Contains(err.Error(), "2 of the agent's commits") {
				t.Errorf("a fetch after the agent rewrote its history: %v; want a refusal naming its 2 commits", err)
			}
			if _, err := f.fabric.Fetch(ctx, id, "", true); err != nil {
				t.Errorf("a forced fetch after the agent rewrote its history: %v", err)
			}
		})
	}
}
