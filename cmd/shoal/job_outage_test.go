package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
)

// outagePool is a coordinator on a port of its own, which a test kills
// and starts again there, and a node on another machine's directory.
type outagePool struct {
	dir, url string
	port     int
	client   []string
}

func startOutagePool(t *testing.T) (*outagePool, *shoalProc) {
	t.Helper()
	p, up := newOutagePool(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	// Turns of about six seconds.
	for range 2 {
		fake.Script(fakemodel.Reply{Text: strings.Repeat("steady ", 60), ChunkSize: 7, Delay: 100 * time.Millisecond})
	}
	p.remoteNode(t, fake)
	return p, up
}

// remoteNode starts node "remote" of the pool, its claude CLI pointed at
// fake, env added to its environment, and returns its home directory.
func (p *outagePool) remoteNode(t *testing.T, fake *fakemodel.Server, env ...string) string {
	t.Helper()
	home := filepath.Join(p.dir, "node")
	env = append(append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache"), env...)
	startShoal(t, home, env, "node", "--nats", p.url, "--name", "remote", "--claude", peers.Claude.Command(t)[0]).waitLine("shoal: node remote joined")
	return home
}

// newOutagePool is a pool on a port of its own, its coordinator (shoal up
// without a node) started; p.coordinator starts it again after a kill.
func newOutagePool(t *testing.T) (*outagePool, *shoalProc) {
	t.Helper()
	p := &outagePool{dir: t.TempDir(), port: freePort(t)}
	p.url = "nats://127.0.0.1:" + strconv.Itoa(p.port)
	p.client = []string{"SHOAL_NATS=" + p.url}
	return p, p.coordinator(t)
}

func (p *outagePool) coordinator(t *testing.T) *shoalProc {
	t.Helper()
	up := startShoal(t, p.dir, nil, "up", "--port", strconv.Itoa(p.port), "--no-node", "--mcp-listen", "127.0.0.1:0", "--no-bus")
	up.waitLine("shoal: ready")
	return up
}

// A job whose turn ends on its node while the coordinator is away ends
// once it is back: the node's reply to the run, sent into a connection
// that was away, was lost (nothing buffers it), and the job waited out
// its --wait for a turn long ended. The node holds the reply until its
// connection is back, and the caller asks again when its own is.
func TestJobOutlivesACoordinatorRestartMidTurn(t *testing.T) {
	t.Parallel()
	p, up := startOutagePool(t)
	repo := oneCommitRepo(t, "repo", "hello\n")
	job := startShoal(t, t.TempDir(), p.client, "job", "--repo", repo, "--wait", "150s", "Go on.")
	var id string
	poll.Until(t, time.Minute, "the job starts", func() bool {
		m := regexp.MustCompile(`shoal: job (\S+) started`).FindStringSubmatch(job.stderrText())
		if m != nil {
			id = m[1]
		}
		return m != nil
	})
	poll.Until(t, time.Minute, "the job's turn streams", func() bool { return streaming(t, p.url, id) })
	up.stop(syscall.SIGKILL)
	time.Sleep(25 * time.Second) // the turn ends on its node meanwhile
	p.coordinator(t)
	select {
	case <-job.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the job still waits after the coordinator came back, its turn long ended on its node; it said:\n%s", job.stderrText())
	}
	if code := job.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the job: exit %d:\n%s", code, job.stderrText())
	}
}

// A detached job outlives an outage of the coordinator longer than a
// command's connection waits for (two minutes): its runner gave up, the
// job was lost, its work never fetched and its agent never closed. And
// `shoal job wait` right after the outage does not take the runner's
// silence through it for its loss.
func TestDetachedJobOutlivesALongCoordinatorOutage(t *testing.T) {
	t.Parallel()
	p, up := startOutagePool(t)
	repo := oneCommitRepo(t, "repo", "hello\n")
	cdir := t.TempDir()
	code, out, errOut := runShoal(t, cdir, p.client, "job", "--detach", "--repo", repo, "--wait", "600s", "Go on.")
	if code != 0 {
		t.Fatalf("job --detach: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	poll.Until(t, time.Minute, "the job's turn streams", func() bool { return streaming(t, p.url, id) })
	up.stop(syscall.SIGKILL)
	time.Sleep(140 * time.Second)
	p.coordinator(t)
	code, out, errOut = runShoal(t, t.TempDir(), p.client, "job", "wait", id)
	if code != 0 {
		log, _ := os.ReadFile(filepath.Join(cdir, "cache", "shoal", "jobs", id+".log"))
		t.Fatalf("shoal job wait after a 140 s outage of the coordinator: exit %d: %s%s\nthe job's log:\n%s", code, out, errOut, log)
	}
	if _, ls, _ := runShoal(t, t.TempDir(), p.client, "ls"); strings.Contains(ls, id) && !strings.Contains(ls, "closed") && !strings.Contains(ls, "dead") {
		t.Errorf("the job's agent after it ended:\n%s", ls)
	}
}
