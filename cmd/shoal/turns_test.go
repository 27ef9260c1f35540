package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// mcpSession connects an MCP client (the official Go SDK's) to the pool's
// coordinator.
func (p *pool) mcpSession() *mcp.ClientSession {
	p.t.Helper()
	var endpoint string
	p.up.mu.Lock()
	for _, l := range p.up.stdout {
		if e, ok := strings.CutPrefix(l, "shoal: MCP endpoint "); ok {
			endpoint = e
		}
	}
	p.up.mu.Unlock()
	if endpoint == "" {
		p.t.Fatal("the coordinator printed no MCP endpoint")
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "turns-test", Version: "1"}, nil)
	s, err := c.Connect(p.t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{}}, nil)
	if err != nil {
		p.t.Fatalf("connect to %s: %v", endpoint, err)
	}
	p.t.Cleanup(func() { s.Close() })
	return s
}

// callText calls an MCP tool and returns its text and whether it is an
// error.
func callText(ctx context.Context, s *mcp.ClientSession, tool string, args map[string]any) (string, bool, error) {
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", false, err
	}
	return res.Content[0].(*mcp.TextContent).Text, res.IsError, nil
}

// A run waits on its agent's record as well as its node: when the node is
// killed mid-turn, `shoal run` and MCP agent_run both end unavailable
// within the heartbeat TTL's bound, not after the run's timeout.
func TestRunEndsWhenItsNodeDies(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Text: "never finishes", Hang: true}, fakemodel.Reply{Text: "never finishes", Hang: true})
	n := p.node("doomed")
	cli, _ := p.openOn()
	viaMCP, _ := p.openOn()
	s := p.mcpSession()

	type ended struct {
		code int
		out  string
	}
	ranCLI := make(chan ended, 1)
	go func() {
		code, _, errOut := p.shoal("run", "--timeout", "10m", cli, "Take forever.")
		ranCLI <- ended{code, errOut}
	}()
	ranMCP := make(chan ended, 1)
	go func() {
		text, isErr, err := callText(t.Context(), s, "agent_run", map[string]any{"agent_id": viaMCP, "text": "Take forever.", "timeout": 600})
		if err != nil {
			text = err.Error()
		}
		code := 0
		if isErr {
			code = 1
		}
		ranMCP <- ended{code, text}
	}()
	for _, id := range []string{cli, viaMCP} {
		poll.Until(t, 60*time.Second, "agent "+id+" working", func() bool {
			var rec schemas.AgentRecord
			code, out, _ := p.shoal("status", id)
			return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusWorking
		})
	}
	// A coordinator just started gives nodes a grace of 3× the TTL to check
	// in before it takes any for lost; the bound holds from then on.
	if settled := time.Until(p.ready.Add(3 * poolNodeTTL)); settled > 0 {
		time.Sleep(settled)
	}
	n.stop(syscall.SIGKILL)
	bound := time.After(poolNodeTTL + 5*time.Second)
	for _, c := range []struct {
		name string
		ran  chan ended
		id   string
		code int
	}{{"shoal run", ranCLI, cli, 4}, {"agent_run", ranMCP, viaMCP, 1}} {
		select {
		case r := <-c.ran:
			want := "agent '" + c.id + "' is dead: its node doomed was lost before the turn ended"
			if r.code != c.code || !strings.Contains(r.out, want) {
				t.Errorf("%s ended %d with %q, want %d and %q", c.name, r.code, r.out, c.code, want)
			}
		case <-bound:
			t.Fatalf("%s still waits %s after its node was killed", c.name, poolNodeTTL+5*time.Second)
		}
	}
}

// A reopened id goes on with its turn numbers, and every reader agrees on
// what turn 3 is: tail (stored and following, started before the reopen),
// tail --from turn:3, output --turn 3 and agent_events.
func TestReopenedLifeEverywhere(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Text: "One."}, fakemodel.Reply{Text: "Two."}, fakemodel.Reply{Text: "Three."})
	p.node("n1")
	id, _ := p.openOn("--id", "lives")
	if out := p.must("run", id, "first"); out != "One." {
		t.Fatalf("turn 1: %q", out)
	}
	p.must("run", id, "second")
	p.must("close", id)
	following := startShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + p.url}, "tail", id)
	following.waitLine("── turn 2 ended")

	p.openOn("--id", id)
	var run schemas.RunReply
	if err := json.Unmarshal([]byte(p.must("run", "--json", id, "third")), &run); err != nil || run.Text != "Three." || run.Turn != 3 {
		t.Fatalf("the second life's turn: %+v %v", run, err)
	}
	following.waitLine("── turn 3 ──")
	following.waitLine("Three.")

	stored := p.must("tail", "--no-follow", id)
	for _, want := range []string{"── turn 1 ──", "One.", "── turn 2 ──", "■ agent dead", "── turn 3 ──", "Three.", "── turn 3 ended"} {
		if !strings.Contains(stored, want) {
			t.Errorf("tail --no-follow lacks %q:\n%s", want, stored)
		}
	}
	from3 := p.must("tail", "--no-follow", "--from", "turn:3", id)
	if !strings.HasPrefix(from3, "» third") || strings.Contains(from3, "Two.") || !strings.Contains(from3, "Three.") {
		t.Errorf("tail --from turn:3:\n%s", from3)
	}
	if out := p.must("output", "--turn", "3", id); out != "Three." {
		t.Errorf("output --turn 3: %q", out)
	}
	if out := p.must("output", "--turn", "1", id); out != "One." {
		t.Errorf("output --turn 1: %q", out)
	}
	var tailed []string
	for _, l := range strings.Split(p.must("tail", "--no-follow", "--raw", "--from", "turn:3", id), "\n") {
		if !strings.Contains(l, `"delta":true`) && !strings.Contains(l, `"tool_input_delta"`) {
			tailed = append(tailed, l)
		}
	}
	text, isErr, err := callText(t.Context(), p.mcpSession(), "agent_events", map[string]any{"agent_id": id, "from_turn": 3})
	if err != nil || isErr {
		t.Fatalf("agent_events: %s %v", text, err)
	}
	var events schemas.EventsReply
	if err := json.Unmarshal([]byte(text), &events); err != nil {
		t.Fatal(err)
	}
	if len(events.Events) != len(tailed) {
		t.Fatalf("agent_events from turn 3 has %d events, tail %d", len(events.Events), len(tailed))
	}
	for i, e := range events.Events {
		if string(e.Event) != tailed[i] {
			t.Errorf("event %d: agent_events %s, tail %s", i, e.Event, tailed[i])
		}
	}
}

// What does not exist is said so, never waited for: tail of an unknown
// agent or from past an agent's end, agent_events of an unknown agent,
// output of a turn the agent never had; and a poller that has caught up
// keeps its place.
func TestReadsOfWhatDoesNotExist(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.node("n1")
	id, _ := p.openOn()
	p.must("run", id, "hello")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tail", "ghost"}, "no such agent: ghost"},
		{[]string{"tail", "--from", "500", id}, "event 500 is past the end"},
		{[]string{"tail", "--no-follow", "--from", "turn:9", id}, "has no turn 9 yet"},
		{[]string{"output", "--turn", "99999", id}, "has no turn 99999 (it has turns 1 to 1)"},
	} {
		if code, _, errOut := p.shoal(c.args...); code != 3 || !strings.Contains(errOut, c.want) {
			t.Errorf("shoal %v: exit %d %q, want 3 and %q", c.args, code, errOut, c.want)
		}
	}
	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events := func(req schemas.EventsRequest) (schemas.EventsReply, error) {
		body, _ := json.Marshal(req)
		msg, err := nc.Request(schemas.FabricSubject("events"), body, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep schemas.EventsReply
		return rep, schemas.DecodeReply(msg.Data, &rep)
	}
	if _, err := events(schemas.EventsRequest{AgentID: "ghost"}); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("agent_events of an unknown agent: %v", err)
	}
	all, err := events(schemas.EventsRequest{AgentID: id, IncludeDeltas: true})
	if err != nil || all.NextEvent == 0 {
		t.Fatalf("agent_events: %+v %v", all, err)
	}
	caughtUp, err := events(schemas.EventsRequest{AgentID: id, FromEvent: all.NextEvent})
	if err != nil || len(caughtUp.Events) != 0 || caughtUp.NextEvent != all.NextEvent {
		t.Errorf("a poller that caught up at %d: next %d, %d events, %v", all.NextEvent, caughtUp.NextEvent, len(caughtUp.Events), err)
	}
	fromTurn, err := events(schemas.EventsRequest{AgentID: id, FromTurn: 2})
	if err != nil || len(fromTurn.Events) != 0 || fromTurn.NextEvent != all.NextEvent {
		t.Errorf("from the next turn: next %d, %d events, %v; want %d", fromTurn.NextEvent, len(fromTurn.Events), err, all.NextEvent)
	}
}

// A node killed with SIGKILL while it runs one turn and holds two more:
// the coordinator closes all three on the stream (the held ones each get
// their start, an error naming the loss and a cancelled result), within
// the TTL of the kill plus a margin, and the id, reopened on another node,
// numbers its next turn 4: a number handed out is never handed out again.
func TestNodeLossClosesHeldTurns(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Text: "never finishes", Hang: true})
	n := p.node("victim")
	id, _ := p.openOn("--id", "held")
	for i, text := range []string{"first", "second", "third"} {
		var rep schemas.SendReply
		if err := json.Unmarshal([]byte(p.must("send", "--json", id, text)), &rep); err != nil || rep.Turn != i+1 {
			t.Fatalf("send %q: %+v %v", text, rep, err)
		}
	}
	poll.Until(t, 60*time.Second, "turn 1 working", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := p.shoal("status", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusWorking
	})
	killed := time.Now()
	n.stop(syscall.SIGKILL)
	type closing struct {
		started, errored, cancelled bool
		at                          time.Time
	}
	var turns map[int]*closing
	poll.Until(t, 60*time.Second, "the stream ends in status dead", func() bool {
		code, out, _ := p.shoal("tail", "--json", "--no-follow", id)
		if code != 0 {
			return false
		}
		turns = map[int]*closing{}
		dead := false
		for line := range strings.Lines(out) {
			var ev struct {
				Kind string          `json:"kind"`
				Turn int             `json:"turn"`
				Time time.Time       `json:"time"`
				Data json.RawMessage `json:"data"`
			}
			if json.Unmarshal([]byte(line), &ev) != nil {
				continue
			}
			c := turns[ev.Turn]
			if c == nil {
				c = &closing{}
				turns[ev.Turn] = c
			}
			switch ev.Kind {
			case "turn_started":
				c.started = true
			case "error":
				c.errored = c.errored || strings.Contains(string(ev.Data), "node victim was lost")
			case "result":
				c.cancelled, c.at = strings.Contains(string(ev.Data), `"cancelled"`), ev.Time
			case "status":
				dead = dead || strings.Contains(string(ev.Data), `"dead"`)
			}
		}
		return dead
	})
	for turn := 1; turn <= 3; turn++ {
		c := turns[turn]
		if c == nil || !c.started || !c.errored || !c.cancelled {
			t.Errorf("turn %d on the stream after its node was lost: %+v, want a start, an error naming the loss and a cancelled result", turn, c)
			continue
		}
		if late := c.at.Sub(killed); late > poolNodeTTL+5*time.Second {
			t.Errorf("turn %d was closed %s after the kill (TTL %s)", turn, late.Round(10*time.Millisecond), poolNodeTTL)
		}
	}
	p.node("heir")
	p.openOn("--id", id, "--node", "heir")
	var rep schemas.SendReply
	if err := json.Unmarshal([]byte(p.must("send", "--json", id, "fourth")), &rep); err != nil || rep.Turn != 4 {
		t.Errorf("the first send after the reopen: %+v %v, want turn 4", rep, err)
	}
}

// A node killed 5 s after the coordinator started, long before the
// monitor's start-up grace (3× the TTL) ends: the monitor heard the node
// since it started, so it takes the node for lost as soon as its entry
// expires, and `shoal run` answers unavailable within the TTL of the
// kill plus a margin.
func TestEarlyNodeLossIsActedOnAtOnce(t *testing.T) {
	t.Parallel()
	// The kill must come 2×TTL−5s after the start at the latest (so that
	// an answer within TTL+5s of it is one the grace did not wait for),
	// and opening the pool's node, its agent and the turn takes 4 s on
	// this machine alone and 8 to 9 s on a loaded core: a TTL of 10 s
	// left 15 s for it, too little for a CI machine whose every core is
	// busy. 20 s leaves 35 s; what the test checks is unchanged.
	const ttl = 20 * time.Second
	p := startPoolTTL(t, ttl)
	p.fake.Script(fakemodel.Reply{Text: "never finishes", Hang: true})
	n := p.node("early")
	id, _ := p.openOn()
	ran := make(chan int, 1)
	var errOut string
	go func() {
		var code int
		code, _, errOut = p.shoal("run", "--timeout", "10m", id, "Take forever.")
		ran <- code
	}()
	poll.Until(t, 60*time.Second, "the turn works", func() bool {
		var rec schemas.AgentRecord
		code, out, _ := p.shoal("status", id)
		return code == 0 && json.Unmarshal([]byte(out), &rec) == nil && rec.Status == schemas.StatusWorking
	})
	if wait := time.Until(p.ready.Add(5 * time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	if since := time.Since(p.ready); since > 3*ttl-ttl-5*time.Second {
		t.Fatalf("the pool took %s to open and start the turn; the kill must come well inside the grace of %s", since, 3*ttl)
	}
	n.stop(syscall.SIGKILL)
	select {
	case code := <-ran:
		want := "agent '" + id + "' is dead: its node early was lost before the turn ended"
		if code != exitUnavailable || !strings.Contains(errOut, want) {
			t.Errorf("shoal run ended %d with %q, want %d and %q", code, errOut, exitUnavailable, want)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("shoal run still waits %s after its node was killed, %s after the coordinator started (TTL %s)", ttl+5*time.Second, time.Since(p.ready).Round(time.Second), ttl)
	}
}

// A node stopped (SIGTERM) and started again: the coordinator says it
// left, not that it was lost; a node killed is lost.
func TestAStoppedNodeLeftNotLost(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	n := p.node("calm")
	if code := n.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("the node exited %d on SIGTERM", code)
	}
	p.node("calm").stop(syscall.SIGKILL)
	poll.Until(t, 30*time.Second, "the coordinator takes the killed node for lost", func() bool {
		return strings.Contains(p.up.stderrText(), `msg="node lost" component=monitor node=calm`)
	})
	log := p.up.stderrText()
	if !strings.Contains(log, `msg="node left" component=monitor node=calm`) || strings.Count(log, `msg="node lost"`) != 1 {
		t.Errorf("the coordinator's log:\n%s", log)
	}
}
