package node_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/schemas"
)

// A turn through the fake CLI is published in Kaimon's order, numbered
// gaplessly, logged without deltas, and recorded in KV.
func TestTurnLifecycle(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	id := f.open(schemas.OpenRequest{ID: "life-1"})
	w := f.watch(id)
	w.until(0, "status idle", isStatus(schemas.StatusIdle))
	if turn := f.send(id, "hello there"); turn != 1 {
		t.Fatalf("first turn is %d", turn)
	}
	end := w.until(0, "result", isResult(1))
	got := strings.Join(w.summary(0)[:end+1-countDeltas(w.events()[:end+1])], " ")
	want := "status:idle@0 user_text@0 status:working@1 turn_started@1 assistant_text+@1 assistant_text@1 status:idle@1 result@1"
	if got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	evs := w.events()
	if evs[0].seq == 0 || evs[0].node != "n1" {
		t.Errorf("first event: seq %d node %q", evs[0].seq, evs[0].node)
	}
	res := evs[end].Payload.(schemas.Result)
	if res.StopReason != schemas.StopEndTurn || res.Usage.InputTokens != 10 || res.Usage.OutputTokens != 3 {
		t.Errorf("result %+v", res)
	}

	// The node's own records: status, output, the event log without deltas.
	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != schemas.StatusIdle || rec.Turn != 1 || rec.Node != "n1" || rec.SessionID != "fake-session-1" || rec.Usage.InputTokens != 10 || rec.Model != "sonnet" {
		t.Errorf("status %s", mustJSON(rec))
	}
	schematest.Control(t, "agent_record", []byte(mustJSON(rec)))
	out, err := f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id})
	if err != nil || out.Text != "echo: hello there" || !out.Done || out.Turn != 1 {
		t.Errorf("output %+v %v", out, err)
	}
	log, err := os.ReadFile(filepath.Join(f.dir, id+".events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(log, []byte(`"delta":true`)) || bytes.Contains(log, []byte(`"status":"working"`)) ||
		!bytes.Contains(log, []byte(`"kind":"user_text"`)) || !bytes.Contains(log, []byte(`"ts":`)) {
		t.Errorf("event log:\n%s", log)
	}
	poll.Until(t, 10*time.Second, "the KV record says idle at turn 1", func() bool {
		r, err := f.fabric.Record(f.ctx(5*time.Second), id)
		return err == nil && r.Status == schemas.StatusIdle && r.Turn == 1
	})

	// A second turn. Its result carries that turn's usage; the agent's
	// usage is the sum of both turns' (Kaimon §7.4), claude's cost 0.0.
	f.send(id, "again")
	end2 := w.until(end+1, "the second result", isResult(2))
	if r := w.events()[end2].Payload.(schemas.Result); r.Usage == nil || r.Usage.InputTokens != 10 || r.Usage.OutputTokens != 3 {
		t.Errorf("turn 2's result carries usage %s, want the turn's own", mustJSON(r.Usage))
	}
	want2 := schemas.Usage{InputTokens: 20, OutputTokens: 6, CacheReadTokens: 2, CacheCreationTokens: 0, CostUSD: schemas.Cost(0)}
	rec, err = f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || mustJSON(rec.Usage) != mustJSON(want2) || rec.Turn != 2 {
		t.Errorf("status after two turns: usage %s turn %d (%v), want usage %s", mustJSON(rec.Usage), rec.Turn, err, mustJSON(want2))
	}
	listed := false
	for _, r := range nodeList(t, f) {
		if r.ID == id {
			listed = true
			if mustJSON(r.Usage) != mustJSON(want2) {
				t.Errorf("the node's list after two turns: usage %s, want %s", mustJSON(r.Usage), mustJSON(want2))
			}
		}
	}
	if !listed {
		t.Errorf("the node's list lacks %s", id)
	}
	poll.Until(t, 10*time.Second, "the KV record (agent_list) has both turns' usage", func() bool {
		recs, err := f.fabric.List(f.ctx(5 * time.Second))
		for _, r := range recs {
			if r.ID == id {
				return err == nil && mustJSON(r.Usage) == mustJSON(want2)
			}
		}
		return false
	})

	// Close: status closed, then dead; the process is gone.
	pid := pidOf(t, f, id)
	rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	if err != nil || !rep.Closed {
		t.Fatalf("close: %+v %v", rep, err)
	}
	closed := w.until(0, "status closed", isStatus(schemas.StatusClosed))
	w.until(closed, "status dead", isStatus(schemas.StatusDead))
	poll.Until(t, 10*time.Second, "the agent's process group is gone", func() bool { return gone(pid) })
	if _, err := f.fabric.Send(f.ctx(10*time.Second), schemas.SendRequest{AgentID: id, Text: "x"}); err == nil || err.Error() != "agent 'life-1' is dead" {
		t.Errorf("send to a dead agent: %v", err)
	}
	poll.Until(t, 10*time.Second, "the KV record says dead", func() bool {
		r, err := f.fabric.Record(f.ctx(5*time.Second), id)
		return err == nil && r.Status == schemas.StatusDead
	})
}

func countDeltas(evs []stored) int {
	n := 0
	for i, e := range evs {
		if e.IsDelta() && i > 0 && evs[i-1].IsDelta() && evs[i-1].Kind() == e.Kind() {
			n++
		}
	}
	return n
}

func pidOf(t *testing.T, f *fixture, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "pids.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m[id].PID == 0 {
		t.Fatalf("pids.json %s: %v", b, err)
	}
	return m[id].PID
}

func TestRunAndInterrupt(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("slow")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "one two"})
	if err != nil || rep.Text != "echo: one two" {
		t.Fatalf("run: %+v %v", rep, err)
	}

	// One synchronous run at a time.
	first := make(chan error, 1)
	go func() {
		_, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "a b c d e f g h i j k l"})
		first <- err
	}()
	w.until(0, "turn 2 starting", func(ev schemas.Event) bool { return ev.Kind() == schemas.KindTurnStarted && ev.Turn == 2 })
	_, err = f.fabric.Run(f.ctx(10*time.Second), schemas.RunRequest{AgentID: id, Text: "x"})
	if err == nil || err.Error() != "agent '"+id+"' already has a synchronous run in flight" || schemas.CodeOf(err) != schemas.CodeConflict {
		t.Errorf("second run: %v", err)
	}
	// An interrupt ends the turn as cancelled, and its run returns.
	ir, err := f.fabric.Interrupt(f.ctx(10*time.Second), schemas.AgentRequest{AgentID: id})
	if err != nil || !ir.Interrupted {
		t.Fatalf("interrupt: %+v %v", ir, err)
	}
	i := w.until(0, "the cancelled result", isResult(2))
	if r := w.events()[i].Payload.(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("interrupted turn ended %s", r.StopReason)
	}
	if errs := errorsOf(w.events()); len(errs) != 0 {
		t.Errorf("an interrupt produced errors: %q", errs)
	}
	if err := <-first; err != nil {
		t.Errorf("the interrupted run: %v", err)
	}
	if ir, err := f.fabric.Interrupt(f.ctx(10*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || ir.Interrupted {
		t.Errorf("interrupt with no turn running: %+v %v", ir, err)
	}
	// The agent takes the next turn; a run that outlasts its timeout says so.
	_, err = f.fabric.Run(f.ctx(30*time.Second), schemas.RunRequest{AgentID: id, Text: "w o r d s w o r d s", Timeout: 0.25})
	if err == nil || err.Error() != "agent '"+id+"' run timed out after 0.25s" || schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Errorf("timed-out run: %v", err)
	}
	w.until(i, "turn 3's result", isResult(3))
	rep, err = f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "last"})
	if err != nil || rep.Text != "echo: last" {
		t.Fatalf("run after the interrupt: %+v %v", rep, err)
	}
}

// A CLI that misbehaves still gets clear errors, a closed turn and the
// right status.
func TestMisbehavingCLI(t *testing.T) {
	t.Parallel()
	cases := []struct {
		mode   string
		cfg    func(*node.Config)
		errors []string // substrings, in order
		stop   schemas.StopReason
		status schemas.AgentStatus
	}{
		{"hang", func(c *node.Config) { c.TurnIdleTimeout, c.InterruptGrace = 700*time.Millisecond, 700*time.Millisecond },
			[]string{"turn 1 produced no output for 700ms; interrupting it", "turn 1 was stopped: produced no output for 700ms, and it did not end within 700ms of the interrupt"},
			schemas.StopCancelled, schemas.StatusDead},
		{"die", nil,
			[]string{"claude exited: exit status 3: fatal: the fake CLI fell over", "the agent process exited during turn 1"},
			schemas.StopCancelled, schemas.StatusDead},
		{"flood", nil,
			[]string{"longer than the 1048576-byte limit; it was dropped"},
			schemas.StopEndTurn, schemas.StatusIdle},
		{"garbage", nil,
			[]string{"stream-json parse error", "stream-json parse error", "stream-json parse error"},
			schemas.StopEndTurn, schemas.StatusIdle},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			cli := fakeCLI(c.mode)
			cli.MaxLine = 1 << 20
			f := startNode(t, fixtureOptions{claude: cli, node: c.cfg})
			id := f.open(schemas.OpenRequest{})
			w := f.watch(id)
			w.until(0, "status idle", isStatus(schemas.StatusIdle))
			pid := pidOf(t, f, id)
			f.send(id, "go")
			i := w.until(0, "the result of turn 1", isResult(1))
			if r := w.events()[i].Payload.(schemas.Result); r.StopReason != c.stop {
				t.Errorf("turn ended %s, want %s", r.StopReason, c.stop)
			}
			errs := errorsOf(w.events())
			for j, want := range c.errors {
				if j >= len(errs) || !strings.Contains(errs[j], want) {
					t.Fatalf("errors %q, want %q at %d", errs, want, j)
				}
			}
			if c.status == schemas.StatusDead {
				w.until(i, "status dead", isStatus(schemas.StatusDead))
				poll.Until(t, 10*time.Second, "the process group is gone", func() bool { return gone(pid) })
			}
			poll.Until(t, 10*time.Second, "the status", func() bool {
				r, err := f.fabric.Record(f.ctx(5*time.Second), id)
				return err == nil && r.Status == c.status
			})
			if c.mode == "die" {
				// What the CLI said on stderr is in <id>.log (Kaimon §4.1).
				log, err := os.ReadFile(filepath.Join(f.dir, id+".log"))
				if err != nil || !strings.Contains(string(log), "fatal: the fake CLI fell over\n") {
					t.Errorf("%s.log: %q %v, want the CLI's complaint", id, log, err)
				}
			}
			if c.mode == "garbage" {
				// The raw line travels with the error.
				for _, e := range w.events() {
					if p, ok := e.Payload.(schemas.Error); ok && strings.Contains(string(p.Data), "Welcome to the fake CLI!") {
						return
					}
				}
				t.Error("no error carries the raw line")
			}
		})
	}
}

func TestControlRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("slow")})
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	notMCP := filepath.Join(t.TempDir(), "servers.json")
	os.WriteFile(notMCP, []byte(`{"servers":["a"]}`), 0o600)
	fifoMCP := filepath.Join(t.TempDir(), "fifo.json")
	if err := syscall.Mkfifo(fifoMCP, 0o600); err != nil {
		t.Fatal(err)
	}
	shoalMCP := filepath.Join(t.TempDir(), "shoal.json")
	os.WriteFile(shoalMCP, []byte(`{"mcpServers":{"files":{"command":"true"},"Shoal":{"type":"http","url":"http://127.0.0.1:1/mcp"}}}`), 0o600)
	bigMCP := filepath.Join(t.TempDir(), "big.json")
	os.WriteFile(bigMCP, make([]byte, 2<<20), 0o600)
	ctx := f.ctx(60 * time.Second)
	openCases := []struct {
		req  schemas.OpenRequest
		code schemas.ErrorCode
		msg  string
	}{
		{schemas.OpenRequest{Node: "n1"}, schemas.CodeInvalid, "invalid open request: Invalid parameter(s): cwd must not be empty"},
		{schemas.OpenRequest{CWD: "/no/such/dir", Node: "n1"}, schemas.CodeInvalid, "agent cwd does not exist: /no/such/dir (on node n1)"},
		{schemas.OpenRequest{CWD: file, Node: "n1"}, schemas.CodeInvalid, "agent cwd is not a directory: " + file},
		{schemas.OpenRequest{CWD: "relative", Node: "n1"}, schemas.CodeInvalid, "must be an absolute path"},
		{schemas.OpenRequest{CWD: t.TempDir(), ID: "Bad.Id", Node: "n1"}, schemas.CodeInvalid, `agent id "Bad.Id" has 'B' at position 1`},
		{schemas.OpenRequest{CWD: t.TempDir(), Permission: "yolo", Node: "n1"}, schemas.CodeInvalid, `permission must be one of default, ask, notebook, specialist, lab, auto, bypass, not "yolo"`},
		{schemas.OpenRequest{CWD: t.TempDir(), Model: strings.Repeat("m", 1<<20), Node: "n1"}, schemas.CodeInvalid, "model must be at most 256 characters long, not 1048576"},
		{schemas.OpenRequest{CWD: t.TempDir(), PermissionMode: "sideways", Node: "n1"}, schemas.CodeInvalid, `unknown permission_mode "sideways"`},
		{schemas.OpenRequest{CWD: t.TempDir(), Model: "acp:opencode", Node: "n1"}, schemas.CodeUnavailable, "node n1 cannot take this agent: cannot run acp:opencode agents"},
		{schemas.OpenRequest{CWD: t.TempDir(), Effort: "extreme", Node: "n1"}, schemas.CodeInvalid, `unknown effort "extreme"`},
		{schemas.OpenRequest{CWD: t.TempDir(), MCPConfig: notMCP, Node: "n1"}, schemas.CodeInvalid, "mcp_config " + notMCP + " is not an MCP configuration (a JSON object with an mcpServers object)"},
		{schemas.OpenRequest{CWD: t.TempDir(), MCPConfig: "/no/such.json", Node: "n1"}, schemas.CodeInvalid, "mcp_config /no/such.json: no such file or directory"},
		// A server of Shoal's name, without the header that tells the
		// door which agent calls: an agent's child would call as a person.
		{schemas.OpenRequest{CWD: t.TempDir(), MCPConfig: shoalMCP, Node: "n1"}, schemas.CodeInvalid, "mcp_config " + shoalMCP + ` names a server "Shoal", the name of Shoal's own: name it otherwise`},
		// A FIFO held the open (and the node's goroutine) up for good; a
		// huge file was read whole.
		{schemas.OpenRequest{CWD: t.TempDir(), MCPConfig: fifoMCP, Node: "n1"}, schemas.CodeInvalid, fifoMCP + " is not a regular file"},
		{schemas.OpenRequest{CWD: t.TempDir(), MCPConfig: bigMCP, Node: "n1"}, schemas.CodeInvalid, bigMCP + " is larger than 1024 KiB"},
	}
	for _, c := range openCases {
		_, err := f.fabric.Open(ctx, c.req)
		if err == nil || !strings.Contains(err.Error(), c.msg) || schemas.CodeOf(err) != c.code {
			t.Errorf("open %+v: got %v (%s), want %s %q", c.req, err, schemas.CodeOf(err), c.code, c.msg)
		}
	}
	// A refused open leaves no record behind.
	if recs, err := f.fabric.List(ctx); err != nil || len(recs) != 0 {
		t.Errorf("after the refused opens the fabric lists %d agents (%v): %+v", len(recs), err, recs)
	}
	id := f.open(schemas.OpenRequest{ID: "taken"})
	if _, err := f.fabric.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: id, Node: "n1"}); err == nil || err.Error() != "agent id already in use: taken" || schemas.CodeOf(err) != schemas.CodeConflict {
		t.Errorf("a live id: %v", err)
	}
	// Requests about an unknown agent; close says false.
	if _, err := f.fabric.Send(ctx, schemas.SendRequest{AgentID: "ghost", Text: "x"}); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("send to unknown: %v", err)
	}
	if _, err := f.fabric.Status(ctx, "ghost"); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("status of unknown: %v", err)
	}
	if _, err := f.fabric.Interrupt(ctx, schemas.AgentRequest{AgentID: "ghost"}); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("interrupt unknown: %v", err)
	}
	if rep, err := f.fabric.Close(ctx, schemas.AgentRequest{AgentID: "ghost"}); err != nil || rep.Closed {
		t.Errorf("close unknown: %+v %v", rep, err)
	}
	if _, err := f.fabric.Send(ctx, schemas.SendRequest{AgentID: "no/pe", Text: "x"}); schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "agent id") {
		t.Errorf("bad id: %v", err)
	}
	// The raw endpoints reject malformed bodies with a clear message.
	nc := natstest.Connect(t, f.b)
	raw := []struct{ verb, body, want string }{
		{"send", `{"agent_id":"taken","text":"x","colour":"red"}`, `invalid send request: Unknown parameter(s): colour. Valid parameters are: agent_id, request_id, text`},
		{"send", `{"agent_id":7}`, "invalid send request: Missing required parameter(s): text. Invalid parameter(s): agent_id must be a string, not the number 7"},
		{"send", `["taken"]`, "invalid send request: the request must be a JSON object, not an array"},
		{"status", `{"agent_id":"` + strings.Repeat("a", 5000) + `"}`, "invalid status request: Invalid parameter(s): agent_id must match ^[a-z0-9][a-z0-9_-]{0,63}$, not a string of 5000 characters"},
		{"open", `not json`, "invalid open request"},
		{"run", `{"agent_id":"taken","text":"x","timeout":-2}`, "invalid run request: Invalid parameter(s): timeout must be more than 0, not -2"},
		{"run", `{"agent_id":"taken","text":"x","timeout":1e308}`, "invalid run request: Invalid parameter(s): timeout must be at most 86400, not 1e+308"},
		{"set_model", `{"agent_id":"taken"}`, "invalid set_model request: Missing required parameter(s): model"},
	}
	for _, r := range raw {
		msg, err := nc.Request(schemas.ControlSubject("n1", schemas.Verb(r.verb)), []byte(r.body), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		schematest.Control(t, "error_reply", msg.Data)
		var rep schemas.ErrorReply
		json.Unmarshal(msg.Data, &rep)
		if rep.Error == nil || !strings.Contains(rep.Error.Message, r.want) {
			t.Errorf("%s %s: reply %s, want %q", r.verb, r.body, msg.Data, r.want)
		}
	}
	// set_model is not something the claude CLI can do live.
	if rep, err := f.fabric.SetModel(ctx, schemas.SetModelRequest{AgentID: id, Model: "opus"}); err != nil || rep.Switched {
		t.Errorf("set_model on claude: %+v %v", rep, err)
	}
}

// Requests about an agent the node does not know, or one that is dead,
// are answered by the node itself with an error code and Kaimon's wording
// (§3; the MCP door adds the "Error <verb>:" prefix), or with the false
// reply Kaimon gives where it gives no error.
func TestRequestsAboutUnknownAndDeadAgents(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	type reply = map[string]any
	unknown := []struct {
		verb schemas.Verb
		req  any
	}{
		{schemas.VerbStatus, schemas.AgentRequest{AgentID: "ghost"}},
		{schemas.VerbInterrupt, schemas.AgentRequest{AgentID: "ghost"}},
		{schemas.VerbRun, schemas.RunRequest{AgentID: "ghost", Text: "x"}},
		{schemas.VerbSend, schemas.SendRequest{AgentID: "ghost", Text: "x"}},
	}
	for _, c := range unknown {
		var rep reply
		err := f.ask(c.verb, c.req, &rep)
		if err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
			t.Errorf("%s of an unknown agent: %v (%s), reply %v", c.verb, err, schemas.CodeOf(err), rep)
		}
	}
	// Kaimon: agent_set_model answers switched false for an unknown agent.
	var sm schemas.SetModelReply
	if err := f.ask(schemas.VerbSetModel, schemas.SetModelRequest{AgentID: "ghost", Model: "opus"}, &sm); err != nil || sm.Switched {
		t.Errorf("set_model of an unknown agent: %+v %v", sm, err)
	}
	// The same through the fabric, which answers from the agent records
	// and the stream.
	ctx := f.ctx(60 * time.Second)
	if _, err := f.fabric.Output(ctx, schemas.OutputRequest{AgentID: "ghost"}); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("fabric output of an unknown agent: %v", err)
	}
	if _, err := f.fabric.Status(ctx, "ghost"); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("fabric status of an unknown agent: %v", err)
	}
	if _, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: "ghost", Text: "x"}); err == nil || err.Error() != "no such agent: ghost" || schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Errorf("fabric run of an unknown agent: %v", err)
	}
	if rep, err := f.fabric.SetModel(ctx, schemas.SetModelRequest{AgentID: "ghost", Model: "opus"}); err != nil || rep.Switched {
		t.Errorf("fabric set_model of an unknown agent: %+v %v", rep, err)
	}

	// A dead agent: a turn is refused as dead; interrupt and set_model say
	// false; status and output still answer.
	id := f.open(schemas.OpenRequest{ID: "corpse"})
	w := f.watch(id)
	f.send(id, "last words")
	w.until(0, "the result", isResult(1))
	if rep, err := f.fabric.Close(ctx, schemas.AgentRequest{AgentID: id}); err != nil || !rep.Closed {
		t.Fatalf("close: %+v %v", rep, err)
	}
	w.until(0, "status dead", isStatus(schemas.StatusDead))
	for _, c := range []struct {
		verb schemas.Verb
		req  any
	}{
		{schemas.VerbRun, schemas.RunRequest{AgentID: id, Text: "x"}},
		{schemas.VerbSend, schemas.SendRequest{AgentID: id, Text: "x"}},
	} {
		var rep reply
		err := f.ask(c.verb, c.req, &rep)
		if err == nil || err.Error() != "agent 'corpse' is dead" || schemas.CodeOf(err) != schemas.CodeUnavailable {
			t.Errorf("%s to a dead agent: %v (%s), reply %v", c.verb, err, schemas.CodeOf(err), rep)
		}
	}
	if _, err := f.fabric.Run(ctx, schemas.RunRequest{AgentID: id, Text: "x"}); err == nil || err.Error() != "agent 'corpse' is dead" || schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Errorf("fabric run to a dead agent: %v", err)
	}
	var ir schemas.InterruptReply
	if err := f.ask(schemas.VerbInterrupt, schemas.AgentRequest{AgentID: id}, &ir); err != nil || ir.Interrupted {
		t.Errorf("interrupt of a dead agent: %+v %v", ir, err)
	}
	if err := f.ask(schemas.VerbSetModel, schemas.SetModelRequest{AgentID: id, Model: "opus"}, &sm); err != nil || sm.Switched {
		t.Errorf("set_model of a dead agent: %+v %v", sm, err)
	}
	var rec schemas.AgentRecord
	if err := f.ask(schemas.VerbStatus, schemas.AgentRequest{AgentID: id}, &rec); err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("status of a dead agent: %s %v", mustJSON(rec), err)
	}
	out, err := f.fabric.Output(ctx, schemas.OutputRequest{AgentID: id})
	if err != nil || out.Status != schemas.StatusDead || out.Text != "echo: last words" || !out.Done || out.Usage != nil {
		t.Errorf("output of a dead agent: %s %v", mustJSON(out), err)
	}
}

// A retried request with the same id acts once.
func TestDuplicateRequestsActOnce(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	ctx := f.ctx(30 * time.Second)
	req := schemas.SendRequest{RequestID: "retry-1", AgentID: id, Text: "once"}
	a, err := f.fabric.Send(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.fabric.Send(ctx, req)
	if err != nil || b.Turn != a.Turn {
		t.Fatalf("retry answered %+v %v, first %+v", b, err, a)
	}
	w.until(0, "the result", isResult(1))
	f.send(id, "twice")
	w.until(0, "turn 2's result", isResult(2))
	n := 0
	for _, e := range w.events() {
		if e.Kind() == schemas.KindUserText {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d user turns, want 2 (the retry must not act)", n)
	}
	cwd := t.TempDir()
	o1, err1 := f.fabric.Open(ctx, schemas.OpenRequest{RequestID: "open-1", CWD: cwd, Node: "n1"})
	o2, err2 := f.fabric.Open(ctx, schemas.OpenRequest{RequestID: "open-1", CWD: cwd, Node: "n1"})
	if err1 != nil || err2 != nil || o1.AgentID != o2.AgentID {
		t.Fatalf("a duplicated open: %+v %v / %+v %v", o1, err1, o2, err2)
	}
	// The same request id for an open elsewhere is another request.
	if _, err := f.fabric.Open(ctx, schemas.OpenRequest{RequestID: "open-1", CWD: t.TempDir(), Node: "n1"}); schemas.CodeOf(err) != schemas.CodeConflict || !strings.Contains(err.Error(), "request id open-1 was used") {
		t.Fatalf("another open under request id open-1: %v", err)
	}
}

// A dead id can be reopened; its events and its turns continue the same
// numbering, so the stream keeps both lives without a gap or a clash, and
// turn 2 means the second life's first turn everywhere.
func TestReopenDeadID(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(c *node.Config) { c.MaxDead = 1 }})
	id := f.open(schemas.OpenRequest{ID: "phoenix"})
	w := f.watch(id)
	f.send(id, "first life")
	w.until(0, "result", isResult(1))
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	dead := w.until(0, "dead", isStatus(schemas.StatusDead))
	logPath := filepath.Join(f.dir, id+".events.jsonl")
	if log, err := os.ReadFile(logPath); err != nil || !bytes.Contains(log, []byte("echo: first life")) || !bytes.Contains(log, []byte(`"status":"dead"`)) {
		t.Fatalf("the first life's event log: %s %v", log, err)
	}
	f.open(schemas.OpenRequest{ID: id})
	f.send(id, "second life")
	w.until(dead, "the second life's result", isResult(2))
	out, err := f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id})
	if err != nil || out.Text != "echo: second life" || out.Turn != 2 {
		t.Errorf("output after reopening: %+v %v", out, err)
	}
	one := 1
	out, err = f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id, Turn: &one})
	if err != nil || out.Text != "echo: first life" || out.Status != schemas.StatusIdle {
		t.Errorf("turn 1's output after reopening: %+v %v", out, err)
	}
	// The event log is truncated at every open (Kaimon §7.3): the new life
	// starts a fresh one; agent_output reads the stream, every life.
	log, err := os.ReadFile(logPath)
	if err != nil || bytes.Contains(log, []byte("first life")) || !bytes.Contains(log, []byte("echo: second life")) {
		t.Errorf("the reopened agent's event log:\n%s %v", log, err)
	}
	if first, _, _ := bytes.Cut(log, []byte("\n")); !bytes.Contains(first, []byte(`"kind":"user_text"`)) || !bytes.Contains(first, []byte("second life")) {
		t.Errorf("the reopened agent's log starts with %s, want the second life's first turn", first)
	}
	all, err := f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id, Which: schemas.WhichAll})
	if err != nil || all.Text != "— turn 1 —\n\necho: first life\n\n— turn 2 —\n\necho: second life" {
		t.Errorf("output all after reopening: %+v %v", all, err)
	}
	// MaxDead 1: closing two more agents forgets the oldest dead one.
	a := f.open(schemas.OpenRequest{})
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: a})
	b := f.open(schemas.OpenRequest{})
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: b})
	poll.Until(t, 10*time.Second, "the oldest dead agent is forgotten", func() bool {
		_, err := f.fabric.Record(f.ctx(5*time.Second), a)
		return schemas.CodeOf(err) == schemas.CodeNotFound
	})
	// The numbers file forgets it too, and keeps the agent still kept.
	poll.Until(t, 10*time.Second, "the forgotten agent's mark leaves the numbers file", func() bool {
		nums, err := os.ReadFile(filepath.Join(f.dir, "numbers.json"))
		return err == nil && !bytes.Contains(nums, []byte(`"`+a+`"`)) && bytes.Contains(nums, []byte(`"`+b+`"`))
	})
	// Its status still answers, from its events in the stream.
	if rec, err := f.fabric.Status(f.ctx(5*time.Second), a); err != nil || rec.Status != schemas.StatusDead {
		t.Errorf("the forgotten agent's status: %+v %v", rec, err)
	}
	if _, err := f.fabric.Status(f.ctx(5*time.Second), b); err != nil {
		t.Errorf("the newest dead agent: %v", err)
	}
}

// Tool-result PNGs are downsampled; an event bigger than the server's
// message limit is cut down with a marker, never dropped.
func TestBigToolResults(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("image")})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "look")
	i := w.until(0, "the tool result", isKind(schemas.KindToolResult))
	img := w.events()[i].Payload.(schemas.ToolResult).Update.Content[0].Content
	raw, _ := base64.StdEncoding.DecodeString(img.Data)
	cfg, err := png.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width != 40 || cfg.Height != 1000 {
		t.Fatalf("image %dx%d %v, want 40x1000", cfg.Width, cfg.Height, err)
	}

	small := natstest.Start(t, func(c *broker.Config) { c.MaxPayload = 64 << 10 })
	g := startNode(t, fixtureOptions{claude: fakeCLI("bigresult"), broker: small})
	id = g.open(schemas.OpenRequest{})
	w = g.watch(id)
	g.send(id, "dump")
	i = w.until(0, "the tool result", isKind(schemas.KindToolResult))
	e := w.events()[i]
	text := e.Payload.(schemas.ToolResult).Update.Content[0].Content.Text
	if len(e.raw) > 64<<10 || !strings.Contains(text, "bytes truncated by shoal") || !strings.HasPrefix(text, "output line\n") {
		t.Fatalf("a %d-byte event, text ends %q", len(e.raw), text[max(0, len(text)-120):])
	}
	w.until(i, "the result", isResult(1))
	log, _ := os.ReadFile(filepath.Join(g.dir, id+".events.jsonl"))
	if !bytes.Contains(log, []byte(strings.Repeat("output line\\n", 1000))) {
		t.Error("the node's event log lost the whole tool output")
	}
}

// A turn that runs past the absolute limit is interrupted: an error says
// why, the turn ends cancelled, and the agent stays usable.
func TestTurnTimeoutInterrupts(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("slow"), node: func(c *node.Config) { c.TurnTimeout = 300 * time.Millisecond }})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	f.send(id, "one two three four five six seven eight nine ten")
	i := w.until(0, "the result", isResult(1))
	if r := w.events()[i].Payload.(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("turn ended %s", r.StopReason)
	}
	if errs := errorsOf(w.events()); len(errs) != 1 || errs[0] != "turn 1 ran longer than 300ms; interrupting it" {
		t.Errorf("errors %q", errs)
	}
	poll.Until(t, 10*time.Second, "the agent is idle again", func() bool {
		r, err := f.fabric.Status(f.ctx(5*time.Second), id)
		return err == nil && r.Status == schemas.StatusIdle
	})
}

// A turn that goes quiet past the inactivity limit is interrupted: an
// error says why, the turn ends cancelled, and a CLI that obeys the
// interrupt keeps running and takes the next turn.
func TestTurnIdleTimeoutInterrupts(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("stall"), node: func(c *node.Config) {
		c.TurnIdleTimeout, c.InterruptGrace = 300*time.Millisecond, time.Minute
	}})
	id := f.open(schemas.OpenRequest{})
	w := f.watch(id)
	w.until(0, "status idle", isStatus(schemas.StatusIdle))
	pid := pidOf(t, f, id)
	f.send(id, "stall now")
	i := w.until(0, "the result", isResult(1))
	if r := w.events()[i].Payload.(schemas.Result); r.StopReason != schemas.StopCancelled {
		t.Errorf("turn ended %s", r.StopReason)
	}
	if errs := errorsOf(w.events()); len(errs) != 1 || errs[0] != "turn 1 produced no output for 300ms; interrupting it" {
		t.Errorf("errors %q", errs)
	}
	rep, err := f.fabric.Run(f.ctx(30*time.Second), schemas.RunRequest{AgentID: id, Text: "still there?"})
	if err != nil || rep.Text != "echo: still there?" {
		t.Fatalf("the turn after the watchdog: %+v %v", rep, err)
	}
	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || rec.Status != schemas.StatusIdle || rec.Turn != 2 {
		t.Errorf("status after the next turn: %s %v", mustJSON(rec), err)
	}
	if now := pidOf(t, f, id); now != pid || !alive(pid) {
		t.Errorf("the agent's process changed or died: pid %d then %d", pid, now)
	}
	if errs := errorsOf(w.events()); len(errs) != 1 {
		t.Errorf("errors after the next turn %q", errs)
	}
}

// A CLI that cannot be launched is reported without the environment, which
// may hold secrets.
func TestLaunchErrorsHideTheEnvironment(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: "/no/such/claude", Env: []string{"ANTHROPIC_API_KEY=sk-secret-123"}}})
	// Placement already knows the node cannot run claude, and says why.
	_, err := f.fabric.Open(f.ctx(10*time.Second), schemas.OpenRequest{CWD: t.TempDir()})
	if err == nil || strings.Contains(err.Error(), "sk-secret") || !strings.Contains(err.Error(), "n1: cannot run claude agents: the claude CLI was not found (/no/such/claude)") {
		t.Fatalf("open with a missing CLI: %v", err)
	}
	// Asked directly, the node's launch error names the CLI and not the environment.
	msg, err := natstest.Connect(t, f.b).Request(schemas.ControlSubject("n1", schemas.VerbOpen), []byte(`{"cwd":"`+t.TempDir()+`"}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.ErrorReply
	json.Unmarshal(msg.Data, &rep)
	if rep.Error == nil || strings.Contains(rep.Error.Message, "sk-secret") || !strings.Contains(rep.Error.Message, "could not launch `/no/such/claude`: not found") {
		t.Fatalf("the node's launch error: %s", msg.Data)
	}
	recs, _ := f.fabric.List(f.ctx(10 * time.Second))
	for _, r := range recs {
		if r.Status != schemas.StatusDead {
			t.Errorf("a failed open left a live record: %+v", r)
		}
	}
}
