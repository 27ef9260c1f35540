package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// natsServerMode, when set in the environment to host:port, makes this
// test binary a bare NATS server with JetStream listening there, its
// store in $SHOAL_TEST_NATS_STORE: a NATS deployment Shoal does not run,
// for shoal up --nats.
const natsServerMode = "SHOAL_TEST_NATS_SERVER"

func runTestNATSServer() {
	host, port, err := net.SplitHostPort(os.Getenv(natsServerMode))
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		fmt.Fprintf(os.Stderr, "%s=%q is no host:port\n", natsServerMode, os.Getenv(natsServerMode))
		os.Exit(1)
	}
	s, err := natsserver.NewServer(&natsserver.Options{Host: host, Port: p, JetStream: true, StoreDir: os.Getenv("SHOAL_TEST_NATS_STORE")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "the NATS server did not start")
		os.Exit(1)
	}
	fmt.Println("nats: ready")
	s.WaitForShutdown()
	os.Exit(0)
}

// testNATS is a bare NATS server (runTestNATSServer) on a port and store
// of its own, which a test may kill and start again on both.
type testNATS struct {
	t        *testing.T
	dir, url string
	port     string
}

func newTestNATS(t *testing.T) *testNATS {
	t.Helper()
	port := strconv.Itoa(freePort(t))
	return &testNATS{t: t, dir: t.TempDir(), url: "nats://127.0.0.1:" + port, port: port}
}

// start starts the server and returns once it is ready.
func (n *testNATS) start() *shoalProc {
	n.t.Helper()
	p := startCommand(n.t, filepath.Join(n.dir, "nats"), []string{natsServerMode + "=127.0.0.1:" + n.port, "SHOAL_TEST_NATS_STORE=" + filepath.Join(n.dir, "nats", "store")}, []string{os.Args[0]})
	p.waitLine("nats: ready")
	return p
}

// up starts shoal up on the server (no node, no bus), args after its own,
// and returns once it is ready.
func (n *testNATS) up(args ...string) *shoalProc {
	n.t.Helper()
	p := startShoal(n.t, filepath.Join(n.dir, "up"), nil, append([]string{"up", "--nats", n.url, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0"}, args...)...)
	p.waitLine("shoal: ready")
	return p
}

// node starts node name on the server, its claude CLI against fake, and
// returns once it joined.
func (n *testNATS) node(fake *fakemodel.Server, name string) *shoalProc {
	n.t.Helper()
	p := n.startNode(fake, name)
	p.waitLine("shoal: node " + name + " joined")
	return p
}

// startNode starts node name on the server, its claude CLI against fake,
// and returns at once.
func (n *testNATS) startNode(fake *fakemodel.Server, name string) *shoalProc {
	n.t.Helper()
	home := filepath.Join(n.dir, name)
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), fake.URL()), "XDG_CACHE_HOME="+home+"/cache", "XDG_DATA_HOME="+home+"/data")
	return startShoal(n.t, home, env, "node", "--nats", n.url, "--name", name, "--claude", peers.Claude.Command(n.t)[0], "--stop-wait", "500ms")
}

// buckets connects to the server and opens the nodes' and agents' buckets.
func (n *testNATS) buckets() (nodes, agents jetstream.KeyValue) {
	n.t.Helper()
	nc, err := nats.Connect(n.url)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if nodes, err = js.KeyValue(n.t.Context(), schemas.NodesBucket); err != nil {
		n.t.Fatal(err)
	}
	if agents, err = js.KeyValue(n.t.Context(), schemas.AgentsBucket); err != nil {
		n.t.Fatal(err)
	}
	return nodes, agents
}

// waitHeartbeat waits until node name's entry in nodes was written after
// since: its heartbeat reached the restarted server.
func waitHeartbeat(t *testing.T, nodes jetstream.KeyValue, name string, since time.Time) {
	t.Helper()
	poll.Until(t, 30*time.Second, "node "+name+" heartbeats to the restarted server", func() bool {
		e, err := nodes.Get(t.Context(), name)
		return err == nil && e.Created().After(since)
	})
}

// agentStatus reads agent id's status from agents.
func agentStatus(t *testing.T, agents jetstream.KeyValue, id string) schemas.AgentStatus {
	t.Helper()
	e, err := agents.Get(t.Context(), id)
	var rec schemas.AgentRecord
	if err != nil || json.Unmarshal(e.Value(), &rec) != nil {
		t.Fatalf("agent %s's record: %v", id, err)
	}
	return rec.Status
}

// shoal up on an external NATS server (--nats) that is killed with
// SIGKILL and started again on its address and store while shoal up and
// a node stay up: the node comes back, and when it is killed in turn
// just after, its agent is marked dead. Heartbeat entries live 2s, and
// so do the markers their expiry leaves: the node-loss monitor must be
// watching the nodes again within seconds of the restart.
func TestNodeLossAfterTheNATSServerRestarts(t *testing.T) {
	t.Parallel()
	n := newTestNATS(t)
	srv := n.start()
	n.up("--node-ttl", "2s")
	node := n.node(fakemodel.Start(t, fakemodel.Config{}), "victim")
	code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + n.url}, "open", "--json", t.TempDir())
	var open schemas.OpenReply
	if code != 0 || json.Unmarshal([]byte(out), &open) != nil {
		t.Fatalf("open: exit %d: %s%s", code, out, errOut)
	}

	srv.stop(syscall.SIGKILL)
	restarted := time.Now()
	n.start()
	nodes, agents := n.buckets()
	waitHeartbeat(t, nodes, "victim", restarted)
	if s := agentStatus(t, agents, open.AgentID); s == schemas.StatusDead {
		t.Fatalf("the agent was marked dead while its node was up")
	}
	node.stop(syscall.SIGKILL)
	poll.Until(t, 30*time.Second, "the killed node's agent is dead", func() bool { return agentStatus(t, agents, open.AgentID) == schemas.StatusDead })
}

// shoal up on an external NATS server stops on Ctrl-C while that server
// is away (killed, not back): the spend ledger's reads of the stream
// tried to make their consumer again forever, and shoal up waited on it.
func TestUpStopsWhileItsNATSServerIsAway(t *testing.T) {
	t.Parallel()
	n := newTestNATS(t)
	srv := n.start()
	up := n.up()
	srv.stop(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // what reads the stream finds it gone, and tries again
	if code := up.stop(syscall.SIGINT); code != 0 {
		t.Errorf("shoal up stopped with exit %d:\n%s", code, up.stderrText())
	}
}

// shoal up on an external NATS server that is away longer than the
// nodes' heartbeat TTL: the server, back, expires every node's entry as
// it starts, though the nodes are alive and reconnecting. Their agents
// stay theirs; a node that does not come back is lost as before.
func TestNodesOutliveAnOutageLongerThanTheirTTL(t *testing.T) {
	t.Parallel()
	n := newTestNATS(t)
	srv := n.start()
	n.up("--node-ttl", "2s")
	fake := fakemodel.Start(t, fakemodel.Config{})
	nodes := map[string]*shoalProc{}
	for _, name := range []string{"stays", "goes"} {
		nodes[name] = n.node(fake, name)
	}
	ids := map[string]string{}
	for name := range nodes {
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + n.url}, "open", "--node", name, "--json", t.TempDir())
		var open schemas.OpenReply
		if code != 0 || json.Unmarshal([]byte(out), &open) != nil {
			t.Fatalf("open on %s: exit %d: %s%s", name, code, out, errOut)
		}
		ids[name] = open.AgentID
	}

	srv.stop(syscall.SIGKILL)
	nodes["goes"].stop(syscall.SIGKILL)
	time.Sleep(5 * time.Second) // past the entries' 2s
	restarted := time.Now()
	n.start()
	kv, agents := n.buckets()
	waitHeartbeat(t, kv, "stays", restarted)
	poll.Until(t, 30*time.Second, "the agent of the node that did not come back is dead", func() bool { return agentStatus(t, agents, ids["goes"]) == schemas.StatusDead })
	if s := agentStatus(t, agents, ids["stays"]); s == schemas.StatusDead {
		t.Fatalf("the agent of node stays, alive through the outage, was marked dead")
	}
	if code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + n.url}, "run", ids["stays"], "Still there?"); code != 0 {
		t.Fatalf("a turn of the agent whose node outlived the outage: exit %d: %s%s", code, out, errOut)
	}
}

// shoal tail and shoal watch follow across a restart of the NATS server:
// the turn after it reaches both, with nothing of the turn before
// repeated.
func TestFollowersGoOnAfterTheNATSServerRestarts(t *testing.T) {
	t.Parallel()
	n := newTestNATS(t)
	srv := n.start()
	n.up()
	fake := fakemodel.Start(t, fakemodel.Config{})
	n.node(fake, "n1")
	env := []string{"SHOAL_NATS=" + n.url}
	code, out, errOut := runShoal(t, t.TempDir(), env, "open", "--json", t.TempDir())
	var open schemas.OpenReply
	if code != 0 || json.Unmarshal([]byte(out), &open) != nil {
		t.Fatalf("open: exit %d: %s%s", code, out, errOut)
	}
	tail := startShoal(t, t.TempDir(), env, "tail", "--json", open.AgentID)
	watch := startShoal(t, t.TempDir(), env, "watch", "--json")
	// Watch follows from the moment it starts, which a loaded machine may
	// delay past the first turn.
	poll.Until(t, 60*time.Second, "shoal watch starts", func() bool {
		return strings.Contains(watch.stderrText(), "shoal: watching")
	})
	// seen waits for a line of p holding all of want.
	seen := func(p *shoalProc, what string, want ...string) {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case l, ok := <-p.lines:
				if !ok {
					t.Fatalf("%s exited before printing %q; stderr:\n%s", what, want, p.stderrText())
				}
				all := true
				for _, w := range want {
					all = all && strings.Contains(l, w)
				}
				if all {
					return
				}
			case <-timeout:
				t.Fatalf("%s did not print %q in a minute; stderr:\n%s", what, want, p.stderrText())
			}
		}
	}
	fake.Script(fakemodel.Reply{Text: "before the restart"})
	if code, out, errOut := runShoal(t, t.TempDir(), env, "run", open.AgentID, "One."); code != 0 {
		t.Fatalf("run: exit %d: %s%s", code, out, errOut)
	}
	seen(tail, "shoal tail", "before the restart")
	seen(watch, "shoal watch", "turn_end", `"turn":1`)
	count := func() (n int) {
		for _, l := range tail.stdoutLines() {
			if strings.Contains(l, "before the restart") {
				n++
			}
		}
		return n
	}
	before := count()

	srv.stop(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // the followers find their server gone
	restarted := time.Now()
	n.start()
	// The node is back when it heartbeats: until then a turn's request
	// has no one to answer it (the node reconnects a second apart).
	nodes, _ := n.buckets()
	waitHeartbeat(t, nodes, "n1", restarted)
	fake.Script(fakemodel.Reply{Text: "after the restart"})
	if code, out, errOut := runShoal(t, t.TempDir(), env, "run", "--wait", "2m", open.AgentID, "Two."); code != 0 {
		t.Fatalf("run after the restart: exit %d: %s%s", code, out, errOut)
	}
	seen(tail, "shoal tail", "after the restart")
	seen(watch, "shoal watch", "turn_end", `"turn":2`)
	if after := count(); after != before {
		t.Errorf("shoal tail printed the turn before the restart again: %d lines of it, %d before the restart", after, before)
	}
}
