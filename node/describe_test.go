package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A node answers describe with what it can run as it stands, and finds a
// claude CLI installed after it started at its next refresh: in its
// answer, in its record in shoal_nodes, and for opens.
func TestDescribeAndRefresh(t *testing.T) {
	t.Parallel()
	cli := fakeCLI("echo")
	cli.Path = filepath.Join(t.TempDir(), "claude") // not there yet
	f := startNode(t, fixtureOptions{claude: cli, node: func(c *node.Config) {
		c.Labels = map[string]string{"site": "lab"}
		c.RefreshInterval = 100 * time.Millisecond
	}})
	nc := natstest.Connect(t, f.b)
	describe := func() schemas.NodeRecord {
		t.Helper()
		m, err := nc.Request(schemas.ControlSubject("n1", schemas.VerbDescribe), nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rec schemas.NodeRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			t.Fatalf("describe answered %s: %v", m.Data, err)
		}
		return rec
	}
	claudeOf := func(rec schemas.NodeRecord) schemas.BackendInfo {
		for _, b := range rec.Backends {
			if b.Kind == "claude" {
				return b
			}
		}
		t.Fatalf("no claude backend in %+v", rec.Backends)
		return schemas.BackendInfo{}
	}
	rec := describe()
	if c := claudeOf(rec); c.Ready || c.Problem != "the claude CLI was not found ("+cli.Path+")" {
		t.Errorf("a missing CLI is described as %+v", c)
	}
	if rec.Name != "n1" || rec.Labels["site"] != "lab" || rec.Host.CPUs == 0 {
		t.Errorf("describe: %+v", rec)
	}
	if _, err := f.fabric.Open(f.ctx(30*time.Second), schemas.OpenRequest{CWD: t.TempDir()}); err == nil {
		t.Error("a claude agent opened on a node without the CLI")
	}

	if err := os.Symlink(os.Args[0], cli.Path); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the node finds the CLI installed since", func() bool {
		return claudeOf(describe()).Ready
	})
	if c := claudeOf(describe()); c.Version != "0.0.0 (fake claude, echo)" {
		t.Errorf("the CLI found later: %+v", c)
	}
	poll.Until(t, 30*time.Second, "the node's record says so too", func() bool {
		nodes, err := f.fabric.Nodes(f.ctx(10 * time.Second))
		return err == nil && len(nodes) == 1 && claudeOf(nodes[0]).Ready
	})
	id := f.open(schemas.OpenRequest{})
	if turn := f.send(id, "hello"); turn != 1 {
		t.Errorf("the first turn is %d", turn)
	}
	schematest.ControlValue(t, "node_record", describe())
	schematest.ControlValue(t, "nodes_reply", schemas.NodesReply{Nodes: []schemas.NodeRecord{describe()}})
}

// The node tells `nats micro info` and its "node ready" log line what it
// can run: only the backends that are ready, and for the others why not.
func TestReadyBackendsInMetadataAndLog(t *testing.T) {
	t.Parallel()
	missing := fakeCLI("echo")
	missing.Path = filepath.Join(t.TempDir(), "claude")
	var log lockedBuffer
	f := startNode(t, fixtureOptions{claude: missing, node: func(c *node.Config) {
		c.Backends = append(c.Backends, fakebackend.New(fakebackend.Config{Kind: "acp"}))
		c.Logger = slog.New(slog.NewJSONHandler(&log, nil))
	}})
	notReady := "claude: the claude CLI was not found (" + missing.Path + ")"

	nc := natstest.Connect(t, f.b)
	m, err := nc.Request("$SRV.INFO."+schemas.ServiceName, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatalf("info %s: %v", m.Data, err)
	}
	if info.Metadata["runs"] != "acp" || info.Metadata["not_ready"] != notReady {
		t.Errorf("nats micro info metadata: runs %q, not_ready %q; want %q and %q", info.Metadata["runs"], info.Metadata["not_ready"], "acp", notReady)
	}

	var line struct {
		Msg      string `json:"msg"`
		Backends string `json:"backends"`
		NotReady string `json:"not_ready"`
	}
	// The service answers a moment before the node logs that it is ready.
	for deadline := time.Now().Add(10 * time.Second); line.Msg == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for l := range strings.Lines(log.String()) {
			if strings.Contains(l, `"msg":"node ready"`) {
				if err := json.Unmarshal([]byte(l), &line); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if line.Msg != "node ready" || line.Backends != "acp" || line.NotReady != notReady {
		t.Errorf("the node ready line: %+v\n%s", line, log.String())
	}
}

// lockedBuffer is a buffer a logger and a test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// slowDescriber is a backend whose description hangs once told to, as a
// CLI's --version or a model server's dial can on a loaded machine.
type slowDescriber struct {
	*fakebackend.Backend
	hang    chan struct{} // closed: Describe hangs until release closes
	release chan struct{}
	hung    chan struct{} // closed once a Describe hangs
	once    sync.Once
}

func (s *slowDescriber) Describe(ctx context.Context) schemas.BackendInfo {
	select {
	case <-s.hang:
		s.once.Do(func() { close(s.hung) })
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	default:
	}
	return schemas.BackendInfo{Kind: s.Kind(), Ready: true}
}

// A refresh that hangs holds no heartbeat: the node's entry stays for
// several lives of an entry while its backends' description hangs, and
// opens still find the node.
func TestAHangingRefreshKeepsTheNodeListed(t *testing.T) {
	t.Parallel()
	slow := &slowDescriber{Backend: fakebackend.New(fakebackend.Config{Kind: "claude"}),
		hang: make(chan struct{}), release: make(chan struct{}), hung: make(chan struct{})}
	defer close(slow.release)
	f := startNode(t, fixtureOptions{node: func(c *node.Config) {
		c.Backends = []backend.Backend{slow}
		c.RefreshInterval = 50 * time.Millisecond
	}})
	close(slow.hang)
	<-slow.hung
	// natstest's entries live 2 s without a beat: this spans three lives.
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		nodes, err := f.fabric.Nodes(f.ctx(10 * time.Second))
		if err != nil || len(nodes) != 1 {
			t.Fatalf("while a refresh hangs, the fabric lists %d nodes (%v)", len(nodes), err)
		}
	}
	if _, err := f.fabric.Open(f.ctx(30*time.Second), schemas.OpenRequest{CWD: t.TempDir()}); err != nil {
		t.Fatalf("an open while a refresh hangs: %v", err)
	}
}
