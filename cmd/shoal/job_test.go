package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal job --detach prints the job's id at once and the job runs in a
// process of its own; shoal job ls lists it and shoal job wait prints its
// outcome, exiting as the job ended. A job whose runner went silent is
// reported lost, and wait exits non-zero saying so.
func TestDetachedJobIsFollowedByWaitAndLs(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := oneCommitRepo(t, "repo", "hello\n")
	in, _ := json.Marshal(map[string]string{"command": "echo detached > d.txt", "description": "write"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})

	id := c.must("job", "--detach", "--repo", repo, "--permission", "bypass", "Write d.txt.")
	if schemas.ValidID(id) != nil {
		t.Fatalf("shoal job --detach printed %q, not a job id", id)
	}
	var listed struct{ Jobs []schemas.JobRecord }
	json.Unmarshal([]byte(c.must("job", "ls", "--json")), &listed)
	if len(listed.Jobs) != 1 || listed.Jobs[0].ID != id || listed.Jobs[0].Repo != repo || listed.Jobs[0].Turns[0] != "Write d.txt." {
		t.Fatalf("shoal job ls while it runs: %+v", listed)
	}
	code, out, errOut := c.shoal("job", "wait", id)
	if code != 0 || !regexp.MustCompile(`^shoal/`+id+` [0-9a-f]{40} \(1 commit, 1 file changed\)\n d.txt \| 1 \+\n`).MatchString(out) ||
		!strings.Contains(errOut, "shoal: job "+id+" succeeded after ") {
		t.Fatalf("shoal job wait: exit %d: %q\n%s", code, out, errOut)
	}
	if got := gitIn(t, repo, "show", "shoal/"+id+":d.txt"); got != "detached" {
		t.Errorf("d.txt on shoal/%s: %q", id, got)
	}
	if ls := c.must("job", "ls"); !regexp.MustCompile(id + `\s+succeeded\s+1/1\s+n\s+\S+\s+shoal/` + id + `\s+` + regexp.QuoteMeta(repo)).MatchString(ls) {
		t.Errorf("shoal job ls after it:\n%s", ls)
	}

	// A job whose runner has said nothing for longer than a job may.
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), schemas.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	old := float64(time.Now().Add(-time.Minute).Unix())
	b, _ := json.Marshal(schemas.JobRecord{ID: "gone1", Status: schemas.JobRunning, Repo: repo, Runner: "elsewhere", Turns: []string{"x"}, StartedAt: old, Beat: old})
	if _, err := kv.Put(t.Context(), "gone1", b); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = c.shoal("job", "wait", "gone1")
	if code == 0 || !strings.Contains(errOut, "job gone1 was lost: the process running it on elsewhere has not been heard from") || !strings.Contains(errOut, "`shoal fetch gone1` brings its work back") {
		t.Errorf("waiting for a lost job: exit %d: %q", code, errOut)
	}
	if ls := c.must("job", "ls"); !regexp.MustCompile(`gone1\s+lost\s+0/1`).MatchString(ls) {
		t.Errorf("shoal job ls with a lost job:\n%s", ls)
	}

	// A repository where the job's branch cannot be made (a branch
	// named shoal) is refused before any turn: it ran them all first.
	blocked := oneCommitRepo(t, "blocked", "x\n")
	gitIn(t, blocked, "branch", "shoal")
	for _, r := range []struct {
		args []string
		want string
	}{
		{[]string{"job", "--repo", blocked, "Go."}, "a branch shoal is there, and git keeps a branch's name from being another's directory; rename it (git branch -m shoal NEW) first"},
		{[]string{"job", "wait"}, "missing the agent id"},
		{[]string{"job", "wait", "nosuch"}, "no such job: nosuch"},
		{[]string{"job", "ls", "extra"}, `unexpected argument "extra"`},
		{[]string{"job", "--repo", repo, "--then", " ", "Go."}, "--then number 1 is empty"},
		{[]string{"job", jobRunArg}, "runs a job shoal job --detach hands it on stdin"},
	} {
		if code, _, errOut := c.shoal(r.args...); code == 0 || !strings.Contains(errOut, r.want) {
			t.Errorf("shoal %v: exit %d: %q, want %q", r.args, code, errOut, r.want)
		}
	}
}
