package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// A job whose agent, among its work, runs git init in a directory of its
// checkout (a scratch repository, a sample project, a fixture) and
// commits nothing there: every turn ended well, yet the job failed, its
// work (job.txt) never came back, and neither shoal fetch nor shoal diff
// could bring it back afterwards: the node's snapshot of the checkout
// (git add --all) refused the nested repository, and with it everything
// else. The real claude CLI's Bash tool runs the command.
func TestJobBringsItsWorkBackBesideANestedRepository(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := oneCommitRepo(t, "repo", "hello\n")
	in, _ := json.Marshal(map[string]string{"command": "echo from-job > job.txt && git init -q scratch", "description": "write"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})

	code, out, errOut := c.shoal("job", "--repo", repo, "--permission", "bypass", "Write job.txt.")
	branches := gitIn(t, repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/shoal/")
	if code != 0 || branches == "" {
		t.Errorf("shoal job whose one turn ended well: exit %d, branches %q: %q\n%s", code, branches, out, errOut)
	}
	id := ""
	for _, l := range strings.Split(errOut, "\n") {
		if rest, ok := strings.CutPrefix(l, "shoal: job "); ok {
			id, _, _ = strings.Cut(rest, " ")
			break
		}
	}
	if id == "" {
		t.Fatalf("no job id in %q", errOut)
	}
	if code, out, errOut := c.shoal("fetch", id); code != 0 {
		t.Fatalf("shoal fetch %s after the job: exit %d: %q\n%s", id, code, out, errOut)
	}
	if got := gitIn(t, repo, "show", "shoal/"+id+":job.txt"); got != "from-job" {
		t.Fatalf("job.txt on shoal/%s: %q", id, got)
	}
}
