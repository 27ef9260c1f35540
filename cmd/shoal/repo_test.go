package main

import (
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/gittest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// gitIn runs git in dir (gittest.Git).
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return gittest.Git(t, dir, args...)
}

// oneCommitRepo is a fresh repository (branch main) whose one commit holds
// README with content.
func oneCommitRepo(t *testing.T, name, content string) string {
	t.Helper()
	repo := filepath.Join(t.TempDir(), name)
	gitIn(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte(content), 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-q", "-m", "first")
	return repo
}

// hiddenNode starts `shoal node` in a mount namespace of its own in which
// hide is an empty tmpfs: the node cannot see what the caller keeps
// there, as a node on another machine cannot.
func hiddenNode(t *testing.T, c *upFixture, model *fakemodel.Server, name, hide string) *shoalProc {
	t.Helper()
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("this test needs unshare (util-linux, which scripts/test installs): %v", err)
	}
	home := filepath.Join(t.TempDir(), name)
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), model.URL()), "XDG_CACHE_HOME="+home+"/cache", "HIDE="+hide, "SHOAL_BIN="+os.Args[0])
	env = append(env, c.client...)
	script := `mount -t tmpfs -o size=1m shoal-hidden "$HIDE" && exec "$SHOAL_BIN" node --name ` + name + ` --claude ` + peers.Claude.Command(t)[0]
	p := startCommand(t, home, env, []string{unshare, "--mount", "--propagation", "private", "sh", "-c", script})
	p.waitLine("shoal: node " + name + " joined")
	return p
}

// An agent opened on a repository of the caller's works, on a node that
// has no copy of it and cannot see the caller's files, in a checkout of
// its own; its work comes back as a branch, the caller's checkout
// untouched; a second open sends only the new commits; --with-changes
// carries the uncommitted work, ignored files left behind.
func TestAgentWorksOnARepositoryItsNodeCannotSee(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--no-node")
	// The agents' model: "run: <command>" runs it with the Bash tool.
	model := fakemodel.Start(t, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		if len(r.ToolResults) > 0 {
			return fakemodel.Reply{Text: "Done."}
		}
		if cmd, ok := strings.CutPrefix(r.UserText, "run: "); ok {
			in, _ := json.Marshal(map[string]string{"command": cmd, "description": "as asked"})
			return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
		}
		return fakemodel.Reply{Text: "ok"}
	}})
	hidden := t.TempDir()
	repo := filepath.Join(hidden, "repo")
	gitIn(t, hidden, "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(repo, ".gitignore"), []byte("*.log\n"), 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-q", "-m", "first")
	for i := range 3 {
		os.WriteFile(filepath.Join(repo, "f"+strconv.Itoa(i)), []byte(strings.Repeat("line\n", 200*(i+1))), 0o644)
		gitIn(t, repo, "add", ".")
		gitIn(t, repo, "commit", "-q", "-m", "more "+strconv.Itoa(i))
	}
	head := gitIn(t, repo, "rev-parse", "HEAD")

	hiddenNode(t, c, model, "n1", hidden)
	hiddenNode(t, c, model, "n2", hidden)

	open := func(args ...string) (id string, sent string) {
		t.Helper()
		code, out, errOut := c.shoal(append([]string{"open", "--repo", repo, "--permission", "bypass"}, args...)...)
		if code != 0 {
			t.Fatalf("open --repo %v: exit %d: %s", args, code, errOut)
		}
		return strings.TrimSpace(out), errOut
	}
	sentBytes := regexp.MustCompile(`sent (\d+) commits? of \S+ to node (\S+): (\d+) bytes`)

	// On each node, a checkout of its own; the first open sends all four
	// commits.
	a, said := open("--node", "n1")
	m := sentBytes.FindStringSubmatch(said)
	if m == nil || m[1] != "4" || m[2] != "n1" {
		t.Fatalf("the first open to n1 did not say it sent the 4 commits:\n%s", said)
	}
	firstBytes, _ := strconv.Atoi(m[3])
	// n2 lacks what n1 lacked: the same bundle serves, already sent.
	b, said := open("--node", "n2")
	if !strings.Contains(said, "were sent before ("+m[3]+" bytes): not sent again") {
		t.Fatalf("the first open to n2 did not say the bundle sent for n1 serves it:\n%s", said)
	}
	var recA, recB struct {
		CWD       string `json:"cwd"`
		Node      string `json:"node"`
		Workspace struct {
			Repo, Base, Commit, Branch, Source string
		} `json:"workspace"`
	}
	json.Unmarshal([]byte(c.must("status", a)), &recA)
	json.Unmarshal([]byte(c.must("status", b)), &recB)
	if recA.Workspace.Base != head || recA.Workspace.Branch != "shoal/"+a || recA.Workspace.Source != repo || recA.CWD == repo || recA.CWD == recB.CWD {
		t.Fatalf("agent %s's record: %+v (agent %s's: %+v)", a, recA, b, recB)
	}

	if ls := c.must("ls"); !strings.Contains(ls, repo+" (shoal/"+a+" from "+head[:12]+")") || !strings.Contains(ls, repo+" (shoal/"+b+" from "+head[:12]+")") {
		t.Fatalf("shoal ls does not show the repository, branch and base of %s and %s:\n%s", a, b, ls)
	}

	// Agent a adds a file and edits one, and notes whether it can see the
	// caller's repository (it cannot: its node does not); b does nothing.
	if out := c.must("run", a, "run: echo from-agent > added.txt && echo changed >> README && (test -e "+repo+"/README && echo visible || echo hidden) > probe.txt"); !strings.Contains(out, "Done.") {
		t.Fatalf("agent %s's turn said %q", a, out)
	}
	diff := c.must("diff", a)
	for _, want := range []string{"added.txt", "+from-agent", "+changed", "+hidden"} {
		if !strings.Contains(diff, want) {
			t.Fatalf("shoal diff %s lacks %q:\n%s", a, want, diff)
		}
	}
	if d := c.must("diff", b); d != "" {
		t.Fatalf("agent %s did nothing, yet its diff is:\n%s", b, d)
	}
	if stat := c.must("diff", "--stat", a); !strings.Contains(stat, "3 files changed") {
		t.Fatalf("shoal diff --stat %s: %s", a, stat)
	}

	// Its work comes back as branch shoal/<a>; the caller's HEAD, index and
	// files are as they were.
	fetched := c.must("fetch", a)
	if !strings.HasPrefix(fetched, "shoal/"+a+" ") {
		t.Fatalf("shoal fetch %s printed %q", a, fetched)
	}
	if got := gitIn(t, repo, "show", "shoal/"+a+":added.txt"); got != "from-agent" {
		t.Fatalf("added.txt on shoal/%s is %q", a, got)
	}
	if got := gitIn(t, repo, "show", "shoal/"+a+":README"); got != "hello\nchanged" {
		t.Fatalf("README on shoal/%s is %q", a, got)
	}
	if msg := gitIn(t, repo, "log", "-1", "--format=%an%n%B", "shoal/"+a); !strings.Contains(msg, "shoal agent "+a) || !strings.Contains(msg, "Turn: 1") || !strings.Contains(msg, "Node: n1") {
		t.Fatalf("the commit of agent %s's uncommitted work says:\n%s", a, msg)
	}
	if got := gitIn(t, repo, "rev-parse", "HEAD"); got != head {
		t.Fatalf("the caller's HEAD moved to %s", got)
	}
	if st := gitIn(t, repo, "status", "--porcelain"); st != "" {
		t.Fatalf("the caller's checkout changed:\n%s", st)
	}
	if _, err := os.Stat(filepath.Join(repo, "added.txt")); !os.IsNotExist(err) {
		t.Fatalf("added.txt is in the caller's working tree: %v", err)
	}
	if branches := gitIn(t, repo, "branch", "--list", "shoal/*"); strings.Contains(branches, "shoal/"+b) {
		t.Fatalf("agent %s's branch came back unasked:\n%s", b, branches)
	}

	// Closed, and reopened on the other node: its work, committed or not,
	// is carried there, and it goes on from it.
	c.must("close", a)
	_, said = open("--id", a, "--node", "n2")
	if !strings.Contains(said, "carried agent "+a+"'s work") || !strings.Contains(said, "from node n1 to node n2") {
		t.Fatalf("reopening %s on n2 said:\n%s", a, said)
	}
	json.Unmarshal([]byte(c.must("status", a)), &recA)
	if recA.Node != "n2" || recA.Workspace.Branch != "shoal/"+a || recA.Workspace.Base != head {
		t.Fatalf("agent %s reopened: %+v", a, recA)
	}
	c.must("run", a, "run: echo more >> added.txt")
	diff = c.must("diff", a)
	for _, want := range []string{"+from-agent", "+more", "+changed", "+hidden"} {
		if !strings.Contains(diff, want) {
			t.Fatalf("after the move to n2, shoal diff %s lacks %q:\n%s", a, want, diff)
		}
	}
	c.must("fetch", a)
	if got := gitIn(t, repo, "show", "shoal/"+a+":added.txt"); got != "from-agent\nmore" {
		t.Fatalf("added.txt on shoal/%s after the move is %q", a, got)
	}

	// A branch the caller has checked out is not moved.
	gitIn(t, repo, "switch", "-q", "shoal/"+a)
	atA := gitIn(t, repo, "rev-parse", "HEAD")
	c.must("run", a, "run: echo again >> added.txt")
	if code, _, errOut := c.shoal("fetch", a); code == 0 || !strings.Contains(errOut, "branch shoal/"+a+" is checked out in "+repo+": switch to another branch first") {
		t.Fatalf("fetch into the checked-out branch shoal/%s: exit %d: %s", a, code, errOut)
	}
	if got := gitIn(t, repo, "rev-parse", "HEAD"); got != atA {
		t.Fatalf("the checked-out branch moved from %s to %s", atA, got)
	}
	gitIn(t, repo, "switch", "-q", "main")

	// A second open on n1 after one more commit sends that commit alone.
	os.WriteFile(filepath.Join(repo, "f9"), []byte("nine\n"), 0o644)
	gitIn(t, repo, "add", "f9")
	gitIn(t, repo, "commit", "-q", "-m", "nine")
	head = gitIn(t, repo, "rev-parse", "HEAD")
	_, said = open("--node", "n1")
	m = sentBytes.FindStringSubmatch(said)
	if m == nil || m[1] != "1" {
		t.Fatalf("the second open to n1 did not say it sent 1 commit:\n%s", said)
	}
	if second, _ := strconv.Atoi(m[3]); second*2 > firstBytes {
		t.Fatalf("the second open sent %d bytes, the first %d: not only the new commit", second, firstBytes)
	}
	// The same commit again: nothing to send.
	if _, said = open("--node", "n1"); !strings.Contains(said, "nothing to send") {
		t.Fatalf("a third open of the same commit on n1 said:\n%s", said)
	}

	// Sandboxed, the agent writes its checkout, and git in it reads the
	// history it shares with the node's cache.
	sb, _ := open("--node", "n1", "--sandbox")
	c.must("run", sb, "run: echo boxed > boxed.txt && git log --oneline | wc -l > count.txt")
	diff = c.must("diff", sb)
	for _, want := range []string{"+boxed", "+5"} {
		if !strings.Contains(diff, want) {
			t.Fatalf("the sandboxed agent %s's diff lacks %q:\n%s", sb, want, diff)
		}
	}

	// --with-changes: an uncommitted edit and an untracked file go, an
	// ignored file stays behind; the caller's checkout keeps them as they
	// were, uncommitted.
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\nuncommitted\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "new.txt"), []byte("untracked\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "secret.log"), []byte("ignored\n"), 0o644)
	before := gitIn(t, repo, "status", "--porcelain")
	w, _ := open("--with-changes", "--node", "n2")
	if out := c.must("run", w, "run: cat README new.txt; test -e secret.log && echo has-secret || echo no-secret"); !strings.Contains(out, "Done.") {
		t.Fatalf("agent %s's turn said %q", w, out)
	}
	if d := c.must("diff", w); d != "" {
		t.Fatalf("agent %s changed nothing, yet its diff (against its start, the caller's changes) is:\n%s", w, d)
	}
	c.must("fetch", w)
	if got := gitIn(t, repo, "show", "shoal/"+w+":README"); got != "hello\nuncommitted" {
		t.Fatalf("README on shoal/%s is %q", w, got)
	}
	if got := gitIn(t, repo, "show", "shoal/"+w+":new.txt"); got != "untracked" {
		t.Fatalf("new.txt on shoal/%s is %q", w, got)
	}
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", "shoal/"+w+":secret.log").CombinedOutput(); err == nil {
		t.Fatalf("the ignored secret.log went to the agent: %s", out)
	}
	if after := gitIn(t, repo, "status", "--porcelain"); after != before {
		t.Fatalf("the caller's uncommitted work changed from\n%s\nto\n%s", before, after)
	}
	if got := gitIn(t, repo, "rev-parse", "HEAD"); got != head {
		t.Fatalf("the caller's HEAD moved to %s", got)
	}
}

// A node SIGKILLed while it receives a repository: the open fails at once
// saying so (not after the open's timeout of minutes), leaves no record
// of the agent, and once the node is back a retry succeeds without the
// bundle being sent again.
func TestRepositoryOpenOnANodeKilledMidTransfer(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--no-node", "--node-ttl", "3s")
	repo := filepath.Join(t.TempDir(), "repo")
	gitIn(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	big := make([]byte, 48<<20) // incompressible, so the node takes a while over it
	rand.Read(big)
	os.WriteFile(filepath.Join(repo, "big.bin"), big, 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-q", "-m", "big")

	home, tmp := filepath.Join(t.TempDir(), "n1"), t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), c.fake.URL()), "XDG_CACHE_HOME="+home+"/cache", "TMPDIR="+tmp)
	env = append(env, c.client...)
	startNode := func() *shoalProc {
		p := startShoal(t, home, env, "node", "--name", "n1", "--claude", peers.Claude.Command(t)[0])
		p.waitLine("shoal: node n1 joined")
		return p
	}
	n1 := startNode()

	open := startShoal(t, t.TempDir(), c.client, "open", "--repo", repo, "--node", "n1", "--id", "moved")
	// The node is receiving once its copy of the bundle is on its disk,
	// in its spool (not the system's temporary directory).
	spooled := filepath.Join(home, "cache", "shoal", "agents", "n1", "spool", "shoal-bundle-*")
	poll.Until(t, 2*time.Minute, "the node receives the bundle", func() bool {
		got, _ := filepath.Glob(spooled)
		return len(got) > 0
	})
	n1.stop(syscall.SIGKILL)
	select {
	case <-open.done:
	case <-time.After(time.Minute):
		t.Fatalf("the open still waits a minute after its node was killed; it said:\n%s", open.stderrText())
	}
	if code := open.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(open.stderrText(), "node n1 was lost or stopped while it opened agent moved") {
		t.Fatalf("the open on a node killed mid-transfer: exit %d:\n%s", code, open.stderrText())
	}
	if code, out, errOut := c.shoal("ls", "--json"); code != 0 || strings.Contains(out, `"moved"`) {
		t.Fatalf("the failed open left a record (exit %d):\n%s%s", code, out, errOut)
	}

	// Back, the node takes the retry; what was sent is not sent again.
	// What the killed node was receiving went with its start.
	startNode()
	if got, _ := filepath.Glob(spooled); len(got) != 0 {
		t.Errorf("the restarted node kept what the killed one was receiving: %v", got)
	}
	if got, _ := filepath.Glob(filepath.Join(tmp, "shoal-*")); len(got) != 0 {
		t.Errorf("the node wrote scratch files in the system's temporary directory: %v", got)
	}
	code, out, errOut := c.shoal("open", "--repo", repo, "--node", "n1", "--id", "moved")
	if code != 0 || strings.TrimSpace(out) != "moved" || !strings.Contains(errOut, "were sent before") || strings.Contains(errOut, "sending ") {
		t.Fatalf("the retry: exit %d: %s\n%s", code, out, errOut)
	}
	if d := c.must("diff", "moved"); d != "" {
		t.Fatalf("the retried agent's diff: %s", d)
	}
}

// shoal job: one prompt on a repository, its work back as a branch, the
// agent closed; a turn that fails exits non-zero saying why.
func TestJobBringsItsWorkBackAsABranch(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := oneCommitRepo(t, "repo", "hello\n")
	head := gitIn(t, repo, "rev-parse", "HEAD")

	bash := func(command string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": command, "description": "write"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	c.fake.Script(bash("echo from-job > job.txt"), fakemodel.Reply{Text: "Written."},
		bash("echo then > then.txt"), fakemodel.Reply{Text: "And that."})
	code, out, errOut := c.shoal("job", "--repo", repo, "--permission", "bypass", "--then", "Write then.txt.", "Write job.txt.")
	m := regexp.MustCompile(`^shoal/(\S+) [0-9a-f]{40} \(1 commit, 2 files changed\)\n job.txt  \| 1 \+\n then.txt \| 1 \+\n 2 files changed, 2 insertions\(\+\)\n$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("shoal job: exit %d: %q\n%s", code, out, errOut)
	}
	id := m[1]
	if !regexp.MustCompile(`shoal: job ` + id + ` succeeded after [0-9.]+m?s: 2 of 2 turns, \d+ tokens in, \d+ out`).MatchString(errOut) {
		t.Errorf("the job's status line: %q", errOut)
	}
	for file, want := range map[string]string{"job.txt": "from-job", "then.txt": "then"} {
		if got := gitIn(t, repo, "show", "shoal/"+id+":"+file); got != want {
			t.Fatalf("%s on shoal/%s is %q", file, id, got)
		}
	}
	if gitIn(t, repo, "rev-parse", "HEAD") != head || gitIn(t, repo, "status", "--porcelain") != "" {
		t.Fatal("the job touched the caller's checkout")
	}
	var rec struct{ Status string }
	json.Unmarshal([]byte(c.must("status", id)), &rec)
	if rec.Status != "dead" {
		t.Fatalf("the job's agent is %s after the job, want closed (dead)", rec.Status)
	}

	c.fake.Script(fakemodel.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorMessage: "the prompt is not allowed"})
	code, out, errOut = c.shoal("job", "--repo", repo, "Fail.")
	if code == 0 || !strings.Contains(errOut, "the turn failed") || !strings.Contains(errOut, "the prompt is not allowed") {
		t.Fatalf("a job whose turn fails: exit %d: %q\n%s", code, out, errOut)
	}
}

// The repository commands refuse what cannot work in one line each.
func TestRepositoryCommandsRefuseBadInput(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	plain := c.must("open", t.TempDir())
	notRepo := t.TempDir()
	if err := os.WriteFile(filepath.Join(notRepo, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"open", "--ref", "main", t.TempDir()}, 2, "--ref and --with-changes go with --repo DIR"},
		{[]string{"open", "--repo", notRepo, "somewhere"}, 2, "it takes no directory"},
		{[]string{"open", "--repo", filepath.Join(notRepo, "nope")}, 2, "repository " + filepath.Join(notRepo, "nope") + " does not exist"},
		{[]string{"open", "--repo", filepath.Join(notRepo, "file")}, 2, "repository " + filepath.Join(notRepo, "file") + " is not a directory"},
		{[]string{"open", "--repo", notRepo}, 2, "is not in a git work tree"},
		{[]string{"job", "do it"}, 2, "job needs --repo DIR"},
		{[]string{"diff", plain}, 2, "agent " + plain + " was not opened on a repository"},
		{[]string{"fetch", plain}, 2, "agent " + plain + " was not opened on a repository"},
		{[]string{"diff", "Not/An/Id"}, 2, "agent id"},
	} {
		code, _, errOut := c.shoal(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("shoal %v: exit %d, want %d saying %q in one line:\n%s", tc.args, code, tc.code, tc.want, errOut)
		}
	}
}

// The repositories' store is bounded (--repos-max-bytes): a bundle that
// would pass it is refused, the open failing with what is full and the
// flag that bounds it, and nothing of it stays; a bundle that fits
// still goes.
func TestRepositoryStoreIsBounded(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--repos-max-bytes", "1MiB")
	repo := filepath.Join(t.TempDir(), "repo")
	gitIn(t, filepath.Dir(repo), "init", "-q", "-b", "main", repo)
	big := make([]byte, 3<<20) // incompressible
	rand.Read(big)
	os.WriteFile(filepath.Join(repo, "big.bin"), big, 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-q", "-m", "big")
	first := c.must("open", "--repo", oneCommitRepo(t, "first", "first\n"), "--id", "first")
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(c.must("status", "--json", first)), &rec); err != nil || rec.Workspace == nil || rec.Workspace.Bundle == "" {
		t.Fatalf("the first agent's workspace: %+v %v", rec.Workspace, err)
	}

	code, out, errOut := c.shoal("open", "--repo", repo, "--id", "toobig")
	if code == 0 || !strings.Contains(errOut, "shoal_repos") || !strings.Contains(errOut, "--repos-max-bytes") {
		t.Fatalf("an open whose bundle passes the store's bound: exit %d: %s\n%s", code, out, errOut)
	}
	if strings.Contains(errOut, "no node can take") || strings.Contains(errOut, "passed over") {
		t.Errorf("the open was tried on other nodes, which have no room to give: %s", errOut)
	}
	t.Logf("refused: %s", errOut)
	// Nothing stored was dropped to make room.
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	obs, err := js.ObjectStore(t.Context(), schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetInfo(t.Context(), rec.Workspace.Bundle); err != nil {
		t.Errorf("the bundle stored before the refusal (%s): %v", rec.Workspace.Bundle, err)
	}
	if code, out, errOut := c.shoal("ls", "--json"); code != 0 || strings.Contains(out, `"toobig"`) {
		t.Fatalf("the refused open left a record (exit %d):\n%s%s", code, out, errOut)
	}
	small := oneCommitRepo(t, "small", "small\n")
	if code, out, errOut := c.shoal("open", "--repo", small, "--id", "fits"); code != 0 || strings.TrimSpace(out) != "fits" {
		t.Fatalf("an open whose bundle fits, after the refusal: exit %d: %s\n%s", code, out, errOut)
	}
}

// An agent on a node whose files the coordinator cannot see opens a child
// in a directory of its own there: the door cannot resolve the path on
// the coordinator's filesystem, so the node that runs the child holds it
// to the parent's directory on its own. Before, every such open was
// refused; a link out of the parent's directory is still refused, by the
// node.
func TestChildInItsParentsDirectoryOnANodeOfItsOwnFiles(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--no-node")
	endpoint := c.printed("MCP endpoint ")
	hide := t.TempDir() // a tmpfs of its own on the node: empty here
	bash := func(cmd string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": cmd, "description": "open"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	post := `curl -s -X POST ` + endpoint + ` -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -H "X-Shoal-Agent-Id: $SHOAL_AGENT_ID"`
	open := func(cwd string) string {
		return `sid=$(` + post + ` -D - -o /dev/null -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"child","version":"0"}}}' | tr -d '\r' | sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: //p')
` + post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
` + post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"agent_open","arguments":{"cwd":"` + cwd + `"}}}'`
	}
	model := fakemodel.Start(t, fakemodel.Config{})
	model.Script(
		bash("mkdir sub && ln -s /etc esc && "+open(hide+"/sub")), fakemodel.Reply{Text: "Opened."},
		bash(open(hide+"/esc")), fakemodel.Reply{Text: "Tried."},
	)
	hiddenNode(t, c, model, "n2", hide)
	parent := c.must("open", "--node", "n2", "--permission", "bypass", "--allow-nested", hide)
	if out := c.must("run", parent, "Open a child in sub."); out != "Opened." {
		t.Fatalf("run: %q", out)
	}
	reqs := model.Requests()
	got := reqs[len(reqs)-1].ToolResults
	if len(got) != 1 || !strings.Contains(got[0].Content, `\"agent_id\"`) {
		t.Fatalf("the child's open in the parent's directory on its node: %+v", got)
	}
	if ls := c.must("ls"); !strings.Contains(ls, hide+"/sub") {
		t.Errorf("no child in %s/sub:\n%s", hide, ls)
	}
	if out := c.must("run", parent, "Open one through the link."); out != "Tried." {
		t.Fatalf("run: %q", out)
	}
	reqs = model.Requests()
	got = reqs[len(reqs)-1].ToolResults
	if len(got) != 1 || !strings.Contains(got[0].Content, "outside the parent's directory") {
		t.Errorf("a child through a link out of the parent's directory: %+v", got)
	}
	if ls := c.must("ls"); strings.Contains(ls, "/etc") {
		t.Errorf("a child was opened in /etc:\n%s", ls)
	}
}

// A write the repositories' store refuses for another reason than its
// bound (its disk full, say) is the coordinator's trouble, not the
// node's: the open says the store did not take the bundle, and is not
// tried on other nodes as "no node can take this agent".
func TestRepositoryStoreRefusingWritesIsNotANodesFault(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(t.Context(), "OBJ_"+schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 64 // every chunk of a bundle is refused
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := c.shoal("open", "--repo", oneCommitRepo(t, "repo", "hello\n"), "--id", "refused")
	if code != exitUnavailable || !strings.Contains(errOut, "the repositories' store shoal_repos did not take it") || strings.Contains(errOut, "no node can take") {
		t.Errorf("an open whose bundle the store refuses: exit %d: %s", code, errOut)
	}
}
