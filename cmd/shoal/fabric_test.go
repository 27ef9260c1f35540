package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// pool is a coordinator and node processes, each a real shoal process.
type pool struct {
	t      *testing.T
	dir    string
	url    string
	fake   *fakemodel.Server
	claude string
	up     *shoalProc
	// ready is when the coordinator said it was ready: its node-loss
	// monitor was started before.
	ready time.Time
}

// poolNodeTTL is the heartbeat TTL a pool's coordinator gives its nodes;
// its node-loss monitor waits 3× this after starting before it takes a
// node that never showed up for lost (coordinator.MonitorConfig.Grace).
const poolNodeTTL = 2 * time.Second

func startPool(t *testing.T) *pool {
	t.Helper()
	return startPoolTTL(t, poolNodeTTL)
}

// startPoolTTL is startPool with another node TTL.
func startPoolTTL(t *testing.T, ttl time.Duration) *pool {
	t.Helper()
	p := &pool{t: t, dir: t.TempDir(), fake: fakemodel.Start(t, fakemodel.Config{}), claude: peers.Claude.Command(t)[0]}
	up := startShoal(t, p.dir, nil, "up", "--port", "-1", "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", ttl.String())
	p.url = strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	p.ready, p.up = time.Now(), up
	return p
}

// node starts `shoal node` with its own home; claude talks to the fake.
func (p *pool) node(name string, args ...string) *shoalProc {
	p.t.Helper()
	return p.nodeWith(name, nil, args...)
}

// nodeWith is node with more environment.
func (p *pool) nodeWith(name string, extra []string, args ...string) *shoalProc {
	p.t.Helper()
	home := filepath.Join(p.dir, name)
	env := append(peers.ClaudeEnv(filepath.Join(home, "claude"), p.fake.URL()),
		"XDG_CACHE_HOME="+home+"/cache", "XDG_DATA_HOME="+home+"/data")
	env = append(env, extra...)
	all := append([]string{"node", "--nats", p.url, "--name", name, "--claude", p.claude, "--stop-wait", "500ms"}, args...)
	n := startShoal(p.t, home, env, all...)
	n.waitLine("shoal: node " + name + " joined")
	return n
}

// shoal runs a client verb against the pool.
func (p *pool) shoal(args ...string) (int, string, string) {
	return runShoal(p.t, p.t.TempDir(), []string{"SHOAL_NATS=" + p.url}, args...)
}

func (p *pool) must(args ...string) string {
	p.t.Helper()
	code, out, errOut := p.shoal(args...)
	if code != 0 {
		p.t.Fatalf("shoal %v: exit %d: %s%s", args, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

func (p *pool) openOn(args ...string) (id, node string) {
	p.t.Helper()
	var rep schemas.OpenReply
	out := p.must(append([]string{"open", "--json"}, append(args, p.t.TempDir())...)...)
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		p.t.Fatalf("open printed %q", out)
	}
	return rep.AgentID, rep.Node
}

// Placement over separate node processes: by backend, by label, by
// explicit node, least loaded first within each node's limit, and a clear
// error when nothing fits.
func TestPlacementAcrossNodes(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.node("alpha", "--labels", "gpu=yes", "--max-agents", "2")
	p.node("beta", "--labels", "site=lab")
	p.node("gamma", "--claude", "/nonexistent/claude")
	var listed struct {
		Nodes []schemas.NodeRecord `json:"nodes"`
	}
	json.Unmarshal([]byte(p.must("nodes", "--json")), &listed)
	if len(listed.Nodes) != 3 {
		t.Fatalf("shoal nodes lists %d nodes", len(listed.Nodes))
	}
	for _, n := range listed.Nodes {
		if n.Host.CPUs == 0 || n.Heartbeat == 0 || n.Instance == "" {
			t.Errorf("node record %+v", n)
		}
		if n.Name == "alpha" && (n.Labels["gpu"] != "yes" || n.MaxAgents != 2 || len(n.Backends) == 0 || !n.Backends[0].Ready || !strings.Contains(n.Backends[0].Version, "2.1.197")) {
			t.Errorf("alpha advertises %+v", n)
		}
	}
	if table := p.must("nodes"); !strings.Contains(table, "alpha") || !strings.Contains(table, "gpu=yes") || !strings.Contains(table, "[claude]") ||
		!strings.Contains(table, "gamma cannot run claude now: the claude CLI was not found (/nonexistent/claude)") {
		t.Errorf("shoal nodes (a backend in brackets, and why under the table):\n%s", table)
	}

	// By backend: gamma cannot run claude, so the least loaded of the
	// others: alpha and beta are idle alike, so either; then the other.
	_, first := p.openOn()
	_, second := p.openOn()
	if !(first == "alpha" && second == "beta" || first == "beta" && second == "alpha") {
		t.Errorf("two claude agents went to %s and %s, want one each on alpha and beta", first, second)
	}
	// By label, then the limit.
	if _, node := p.openOn("--labels", "gpu=yes"); node != "alpha" {
		t.Errorf("gpu=yes went to %s", node)
	}
	if _, node := p.openOn("--labels", "site=lab"); node != "beta" {
		t.Errorf("site=lab went to %s", node)
	}
	code, _, errOut := p.shoal("open", "--labels", "gpu=yes", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "alpha: is full (2 of 2 agents)") {
		t.Errorf("a full node: %d %q", code, errOut)
	}
	// By explicit node.
	if _, node := p.openOn("--node", "beta"); node != "beta" {
		t.Errorf("--node beta went to %s", node)
	}
	code, _, errOut = p.shoal("open", "--node", "gamma", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "node gamma cannot take this agent: cannot run claude agents") {
		t.Errorf("--node gamma: %q", errOut)
	}
	code, _, errOut = p.shoal("open", "--node", "delta", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "no node named delta is running (nodes: alpha, beta, gamma)") {
		t.Errorf("--node delta: %q", errOut)
	}
	// Nothing fits: every node and why.
	code, _, errOut = p.shoal("open", "--labels", "gpu=no", t.TempDir())
	for _, want := range []string{"no node can take this agent", "alpha: has gpu=yes, not no", "beta: lacks label gpu=no", "gamma: cannot run claude agents"} {
		if code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("nothing fits: %q lacks %q", errOut, want)
		}
	}
	code, _, errOut = p.shoal("open", "--model", "acp:opencode", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "alpha: cannot run acp:opencode agents") {
		t.Errorf("an ACP model: %q", errOut)
	}
	// A cwd is checked on the node that runs the agent.
	code, _, errOut = p.shoal("open", "--node", "beta", "/no/such/dir/anywhere")
	if code == 0 || !strings.Contains(errOut, "agent cwd does not exist: /no/such/dir/anywhere") {
		t.Errorf("a missing cwd: %q", errOut)
	}
	// ls shows where each agent runs.
	ls := p.must("ls")
	if strings.Count(ls, " alpha ") != 2 || strings.Count(ls, " beta ") != 3 {
		t.Errorf("ls:\n%s", ls)
	}
}

// A node killed with SIGKILL mid-turn: within the heartbeat TTL the turn
// is closed and the agent is dead; its replayed stream is complete and
// ordered and ends in the closing events; the restarted node has no agent
// process left, resurrects nothing, and a second node under its name is
// refused.
func TestNodeLossClosesTurns(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	// Its thinking comes first: the CLI reports what the message used so
	// far once that block is done, while the text is still to come.
	p.fake.Script(fakemodel.Reply{Thinking: "Slowly, then.", Text: strings.Repeat("slowly ", 200), ChunkSize: 7, Delay: 100 * time.Millisecond})
	n := p.node("victim")
	id, _ := p.openOn()
	pidsFile := filepath.Join(p.dir, "victim", "cache", "shoal", "agents", "victim", "pids.json")
	p.must("send", id, "Take your time.")

	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "the turn streams", func() bool {
		m, err := stream.GetLastMsgForSubject(t.Context(), schemas.EventSubject(id))
		return err == nil && strings.Contains(string(m.Data), `"delta":true`)
	})
	var pids map[string]struct {
		PID int `json:"pid"`
	}
	if b, err := readFile(pidsFile); err != nil || json.Unmarshal([]byte(b), &pids) != nil || pids[id].PID == 0 {
		t.Fatalf("pids.json before the kill: %q %v", b, err)
	}
	agentPID := pids[id].PID
	// What the turn used so far (the CLI reports it as the model's
	// messages come) is in the record before the kill: the bucket's,
	// which the node writes within a second (shoal status asks the node,
	// which knows it first).
	records, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	var running schemas.AgentRecord
	poll.Until(t, 30*time.Second, "the record says what the running turn used", func() bool {
		e, err := records.Get(t.Context(), id)
		running = schemas.AgentRecord{}
		return err == nil && json.Unmarshal(e.Value(), &running) == nil && running.Running != nil
	})
	killed := time.Now()
	if code := n.stop(syscall.SIGKILL); code != -1 {
		t.Logf("the node exited %d", code)
	}
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the agent is dead", func() bool {
		code, out, _ := p.shoal("status", id)
		rec = schemas.AgentRecord{}
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusDead
	})

	// Replay from the start: gapless, ordered, ending in the closing events.
	cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	var evs []schemas.Event
	var hdrs []nats.Header
	var last uint64
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			break
		}
		_, n, err := schemas.ParseMsgID(m.Headers().Get(schemas.HeaderMsgID))
		if err != nil || n != last+1 {
			t.Fatalf("event number %d after %d (%v)", n, last, err)
		}
		last = n
		ev, err := schemas.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		hdrs = append(hdrs, m.Headers())
	}
	if len(evs) < 6 {
		t.Fatalf("%d events replayed", len(evs))
	}
	tail := evs[len(evs)-3:]
	e, isErr := tail[0].Payload.(schemas.Error)
	r, isResult := tail[1].Payload.(schemas.Result)
	s, isStatus := tail[2].Payload.(schemas.Status)
	if !isErr || !strings.Contains(e.Message, "node victim was lost during turn 1") || !isResult || r.StopReason != schemas.StopCancelled ||
		!isStatus || s.Status != schemas.StatusDead || tail[1].Turn != 1 {
		t.Fatalf("the stream ends with %+v", tail)
	}
	// What the turn used before its node was lost is counted: in its
	// result (the coordinator's count, shoal usage) and in the record (the
	// agent's budget). It used nothing, once.
	if r.Usage == nil || schemas.TokensOf(*r.Usage) < schemas.TokensOf(*running.Running) {
		t.Errorf("the lost turn's result carries %+v; the record said it had used %+v", r.Usage, *running.Running)
	} else if rec.Running != nil || schemas.TokensOf(rec.Usage) != schemas.TokensOf(*r.Usage) {
		t.Errorf("the dead record's usage %+v (running %+v), its turn's result %+v", rec.Usage, rec.Running, *r.Usage)
	}
	for _, h := range hdrs[len(hdrs)-3:] {
		if h.Get(schemas.HeaderNode) != "coordinator" {
			t.Errorf("a closing event was published by %q, not the coordinator's monitor", h.Get(schemas.HeaderNode))
		}
	}

	// The turn was closed within the heartbeat TTL of the kill. The node
	// heartbeats every TTL/3, so its entry expires at most a TTL after the
	// kill; the monitor acts on the expiry at once, unless it is still in
	// its start-up grace (3× TTL from before the pool was ready), when it
	// acts at the grace's end. The margin of 5s, generous against a TTL of
	// 2s, covers the server noticing the expiry and the monitor's KV writes
	// and publishes on a loaded 2-core machine under -race.
	closed, err := time.Parse(time.RFC3339Nano, hdrs[len(hdrs)-3].Get(schemas.HeaderTime))
	if err != nil {
		t.Fatalf("the closing error's time: %v", err)
	}
	const margin = 5 * time.Second
	due := killed.Add(poolNodeTTL)
	if settled := p.ready.Add(3 * poolNodeTTL); settled.After(due) {
		due = settled
	}
	if late := closed.Sub(due); late > margin {
		t.Errorf("the turn was closed %s after the kill, %s after it was due (TTL %s, margin %s)",
			closed.Sub(killed).Round(10*time.Millisecond), late.Round(10*time.Millisecond), poolNodeTTL, margin)
	}
	if closed.Before(killed) {
		t.Errorf("the turn was closed at %s, before the kill at %s", closed, killed)
	}
	t.Logf("the turn was closed %s after its node was killed (TTL %s)", closed.Sub(killed).Round(10*time.Millisecond), poolNodeTTL)

	// Requests for the lost agent answer unavailable at once, through the
	// coordinator's fabric service and through a direct client alike:
	// well within a tenth of their timeout, so not by waiting on a node
	// that will never answer.
	if code, _, errOut := p.shoal("send", id, "are you there?"); code == 0 || !strings.Contains(errOut, "agent '"+id+"' is dead") {
		t.Errorf("a send to the lost agent: %q", errOut)
	}
	const reqTimeout = 30 * time.Second
	direct, err := client.NewDirect(nc, client.Config{Timeout: reqTimeout})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		verb string
		req  any
		call func() error
	}{
		{"send", schemas.SendRequest{AgentID: id, Text: "are you there?"}, func() error {
			_, err := direct.Send(t.Context(), schemas.SendRequest{AgentID: id, Text: "are you there?"})
			return err
		}},
		{"run", schemas.RunRequest{AgentID: id, Text: "are you there?", Timeout: 20}, func() error {
			_, err := direct.Run(t.Context(), schemas.RunRequest{AgentID: id, Text: "are you there?", Timeout: 20})
			return err
		}},
	} {
		body, _ := json.Marshal(r.req)
		start := time.Now()
		m, err := nc.Request(schemas.FabricSubject(schemas.Verb(r.verb)), body, reqTimeout)
		took := time.Since(start)
		var reply schemas.ErrorReply
		switch {
		case err != nil:
			t.Errorf("%s through the coordinator: %v after %s", r.verb, err, took)
		case json.Unmarshal(m.Data, &reply) != nil || reply.Error == nil || reply.Error.Code != schemas.CodeUnavailable:
			t.Errorf("%s through the coordinator answered %s, want the code %q", r.verb, m.Data, schemas.CodeUnavailable)
		}
		if took > reqTimeout/10 {
			t.Errorf("%s through the coordinator took %s to answer", r.verb, took)
		}
		start = time.Now()
		err = r.call()
		took = time.Since(start)
		if schemas.CodeOf(err) != schemas.CodeUnavailable {
			t.Errorf("%s from a direct client: %v (code %q), want the code %q", r.verb, err, schemas.CodeOf(err), schemas.CodeUnavailable)
		}
		if took > reqTimeout/10 {
			t.Errorf("%s from a direct client took %s to answer", r.verb, took)
		}
	}
	// An interrupt interrupts nothing and a close finds it closed, as its
	// node would answer for a dead agent, without waiting on the node.
	for _, r := range []struct{ verb, want string }{{"interrupt", `{"interrupted":false}`}, {"close", `{"closed":true}`}} {
		start := time.Now()
		m, err := nc.Request(schemas.FabricSubject(schemas.Verb(r.verb)), []byte(`{"agent_id":"`+id+`"}`), reqTimeout)
		if took := time.Since(start); err != nil || string(m.Data) != r.want || took > reqTimeout/10 {
			t.Errorf("%s of the lost agent through the coordinator: %v %s after %s, want %s", r.verb, err, msgData(m), took, r.want)
		}
	}
	if ir, err := direct.Interrupt(t.Context(), schemas.AgentRequest{AgentID: id}); err != nil || ir.Interrupted {
		t.Errorf("interrupt of the lost agent from a direct client: %+v %v", ir, err)
	}
	// Its status is the record's: dead, not an error.
	var status schemas.AgentRecord
	m, err := nc.Request(schemas.FabricSubject("status"), []byte(`{"agent_id":"`+id+`"}`), reqTimeout)
	if err == nil {
		err = schemas.DecodeReply(m.Data, &status)
	}
	if err != nil || status.Status != schemas.StatusDead || status.Node != "victim" {
		t.Errorf("status through the coordinator: %v %+v", err, status)
	}

	// The node comes back under its name: nothing is left running and
	// nothing is resurrected.
	n2 := p.node("victim")
	if b, err := readFile(pidsFile); err != nil || strings.TrimSpace(b) != "{}" {
		t.Errorf("pids.json after the restart: %q %v", b, err)
	}
	if syscall.Kill(agentPID, 0) != syscall.ESRCH && processState(agentPID) != "Z" {
		t.Errorf("the agent's claude process %d is still there after the node restarted", agentPID)
	}
	code, out, _ := p.shoal("status", id)
	if code != 0 || !strings.Contains(out, `"status": "dead"`) {
		t.Errorf("status after the restart: %s", out)
	}
	if ls := p.must("ls"); strings.Count(ls, id) != 1 {
		t.Errorf("ls after the restart:\n%s", ls)
	}
	home := filepath.Join(p.dir, "victim-twin")
	code, _, errOut := runShoal(t, home, []string{"XDG_CACHE_HOME=" + home}, "node", "--nats", p.url, "--name", "victim", "--claude", p.claude)
	if code != exitConflict || !strings.Contains(errOut, "a node named victim is already running") || !strings.Contains(errOut, "--node-name") {
		t.Errorf("a second node named victim: exit %d %q, want %d (conflict)", code, errOut, exitConflict)
	}
	code, _, errOut = runShoal(t, home, nil, "node", "--nats", p.url, "--name", "usurper", "--claude", p.claude,
		"--dir", filepath.Join(p.dir, "victim", "cache", "shoal", "agents", "victim"))
	if code != exitConflict || !strings.Contains(errOut, "is in use by another node") || !strings.Contains(errOut, "--node-name") {
		t.Errorf("a second node in victim's dir: exit %d %q, want %d (conflict)", code, errOut, exitConflict)
	}
	n2.stop(syscall.SIGTERM)
}

// msgData is a message's body, or "" for none.
func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
