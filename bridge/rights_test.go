package bridge_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// The door holds every tool to the rights rules: an agent asks about
// agents of each relation to it, with each tool that names an agent, and
// is refused exactly where schemas.Decide refuses, with the rule named;
// its lists show its own subtree alone. Its guard is lifted, so its tool
// policy lets every tool through and the rights alone decide.
func TestDoorHoldsEveryToolToTheRights(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	work := t.TempDir()
	put := func(id, parent string, reach schemas.Reach, sandboxed bool) schemas.AgentRecord {
		rec := schemas.AgentRecord{ID: id, Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(work), Parent: parent, Reach: reach}
		if parent != "" {
			rec.Depth = 1
		}
		if sandboxed {
			rec.Sandbox = &schemas.SandboxPolicy{Kernel: "test"}
		}
		putRecord(t, fb, rec)
		return rec
	}
	// root ── p ──┬── a ── kid ── grand
	//             └── sib ── cousin
	// stranger (another client's), and a sandboxed agent with reach all.
	put("root", "", "", false)
	put("p", "root", "", false)
	me := put("a", "p", "", false)
	put("kid", "a", "", false)
	put("grand", "kid", "", false)
	put("sib", "p", "", false)
	put("cousin", "sib", "", false)
	put("stranger", "", "", false)
	wide := put("wide", "", schemas.ReachRead, false)
	boxed := put("boxed", "", schemas.ReachAll, true)
	put("boxedkid", "boxed", "", true)
	relations := map[string]schemas.Relation{
		"a": schemas.RelSelf, "kid": schemas.RelChild, "grand": schemas.RelDescendant, "p": schemas.RelParent,
		"root": schemas.RelAncestor, "sib": schemas.RelSibling, "cousin": schemas.RelRelative, "stranger": schemas.RelUnrelated,
	}
	argsOn := func(tool, target string) map[string]any {
		switch tool {
		case "agent_send":
			return map[string]any{"agent_id": target, "text": "x"}
		case "agent_run":
			return map[string]any{"agent_id": target, "text": "x", "timeout": 1}
		case "agent_set_model":
			return map[string]any{"agent_id": target, "model": "opus"}
		case "agent_permit":
			// A deny: an agent's allow is held to its allowlist as well
			// (TestDoorHoldsAnAgentsAllowToItsAllowlist), by the tool of a
			// request that is waiting, and none is here.
			return map[string]any{"agent_id": target, "request_id": "perm-1", "decision": "deny"}
		}
		return map[string]any{"agent_id": target}
	}
	var targeted []string
	for tool, a := range schemas.ToolAccess {
		if a == schemas.AccessRead || a == schemas.AccessAct || a == schemas.AccessAnswer {
			if tool != "agent_list" && tool != "agent_pending" {
				targeted = append(targeted, tool)
			}
		}
	}
	slices.Sort(targeted)
	check := func(s *mcp.ClientSession, who schemas.AgentRecord, tool, target string, rel schemas.Relation, sandboxed bool, confined ...schemas.Confined) {
		t.Helper()
		tgt := schemas.Target{Agent: target, Rel: rel, Sandboxed: sandboxed}
		if len(confined) > 0 {
			tgt.Confined = confined[0]
		}
		v := schemas.Decide(schemas.AgentPrincipal(who), schemas.ToolAccess[tool], tgt)
		text, isErr := call(t, s, tool, argsOn(tool, target))
		refused := isErr && strings.HasPrefix(text, tool+" refused: ")
		switch {
		case v.Allowed && refused:
			t.Errorf("%s by %s on its %s %s was refused: %s", tool, who.ID, rel, target, text)
		case !v.Allowed && (!refused || !strings.Contains(text, fmt.Sprintf("rule %s: %s", v.Rule, v.Rule.Text()))):
			t.Errorf("%s by %s on its %s %s: %q, want a refusal by rule %s", tool, who.ID, rel, target, text, v.Rule)
		}
	}
	as := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	for _, tool := range targeted {
		for target, rel := range relations {
			check(as, me, tool, target, rel, false)
		}
	}
	// Reach granted at open: reading every agent, not driving one.
	ws := fb.client(map[string]string{schemas.AgentIDHeader: "wide"})
	for _, tool := range targeted {
		check(ws, wide, tool, "stranger", schemas.RelUnrelated, false)
	}
	// A sandboxed agent, even with reach all, drives only sandboxed agents.
	bs := fb.client(map[string]string{schemas.AgentIDHeader: "boxed"})
	for _, tool := range targeted {
		check(bs, boxed, tool, "stranger", schemas.RelUnrelated, false)
		check(bs, boxed, tool, "boxedkid", schemas.RelChild, true)
	}

	// Lists hold the agent's own subtree.
	var list schemas.ListReply
	ok(t, as, "agent_list", nil, &list)
	var ids []string
	for _, r := range list.Agents {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	if strings.Join(ids, " ") != "a grand kid" {
		t.Errorf("agent a lists %v, want itself, its child and grandchild", ids)
	}
	ok(t, ws, "agent_list", nil, &list)
	if len(list.Agents) != 11 {
		t.Errorf("an agent with reach read lists %d agents, want all 11", len(list.Agents))
	}
	// A person is held to nothing of this.
	person := fb.client(nil)
	ok(t, person, "agent_list", nil, &list)
	if len(list.Agents) != 11 {
		t.Errorf("a person lists %d agents, want all 11", len(list.Agents))
	}

	// An agent opens a child no wider in reach than itself.
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "reach": "read"}); !isErr || !strings.Contains(text, "a child may not exceed its parent: reach read is wider than agent a's (own)") {
		t.Errorf("a child with more reach than its parent: %q", text)
	}

	// A sandboxed agent in namespaces of its own, granted reach all,
	// drives no sandboxed agent held more loosely than itself: one in
	// Landlock alone, or one that may reach a host it may not.
	boxedAs := func(id, kernel string, reach schemas.Reach, net ...string) schemas.AgentRecord {
		rec := schemas.AgentRecord{ID: id, Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(work), Reach: reach, SandboxNet: net,
			Sandbox: &schemas.SandboxPolicy{Kernel: kernel}}
		putRecord(t, fb, rec)
		return rec
	}
	tight := boxedAs("tight", "namespaces, landlock ABI 7", schemas.ReachAll, "pypi.org")
	ts := fb.client(map[string]string{schemas.AgentIDHeader: "tight"})
	for _, c := range []struct {
		target schemas.AgentRecord
		want   schemas.Rule
	}{
		{boxedAs("loose", "landlock ABI 7", ""), schemas.RuleLaxer},
		{boxedAs("wider", "namespaces, landlock ABI 7", "", "example.com"), schemas.RuleLaxer},
		{boxedAs("narrower", "namespaces, landlock ABI 7", "", "pypi.org"), ""},
		{boxedAs("unnetted", "namespaces, landlock ABI 7", ""), ""},
	} {
		target, want := c.target, c.want
		for _, tool := range targeted {
			a := schemas.ToolAccess[tool]
			v := schemas.Decide(schemas.AgentPrincipal(tight), a, schemas.Target{Agent: target.ID, Rel: schemas.RelUnrelated, Sandboxed: true, Confined: schemas.ConfinedOf(target)})
			if (a == schemas.AccessAct || a == schemas.AccessAnswer) && (v.Allowed != (want == "") || (!v.Allowed && v.Rule != want)) {
				t.Fatalf("%s by tight on %s: the rules say %+v, want rule %q", tool, target.ID, v, want)
			}
			check(ts, tight, tool, target.ID, schemas.RelUnrelated, true, schemas.ConfinedOf(target))
		}
	}
}

// Permission requests: an agent sees, in agent_pending, only the requests
// of its own subtree, and answers those of its children, never its own or
// its parent's.
func TestDoorPendingAndAnswers(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	for _, r := range []struct{ id, parent string }{{"p", ""}, {"a", "p"}, {"kid", "a"}, {"other", ""}} {
		putRecord(t, fb, schemas.AgentRecord{ID: r.id, Status: schemas.StatusIdle, Node: "n9", Policy: free.Record("/work"), Parent: r.parent})
	}
	_, js := natstest.JetStream(t, fb.b)
	kv, err := js.KeyValue(t.Context(), schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"p", "a", "kid", "other"} {
		b, _ := json.Marshal(schemas.PermitRecord{AgentID: id, RequestID: "perm-" + id, Node: "n9", Tool: "Bash", Input: json.RawMessage(`{"command":"secret of ` + id + `"}`)})
		if _, err := kv.Put(t.Context(), schemas.PermitKey(id, "perm-"+id), b); err != nil {
			t.Fatal(err)
		}
	}
	as := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	var pending schemas.PendingReply
	ok(t, as, "agent_pending", nil, &pending)
	var seen []string
	for _, r := range pending.Requests {
		seen = append(seen, r.AgentID)
	}
	slices.Sort(seen)
	if strings.Join(seen, " ") != "a kid" {
		t.Errorf("agent a sees the requests of %v, want its own and its child's", seen)
	}
	// Who may answer, whatever the answer: a deny (an allow is held to
	// the answering agent's allowlist besides, below).
	for target, want := range map[string]string{"a": "rule own-requests", "p": "rule own-requests", "other": "rule subtree", "kid": ""} {
		text, isErr := call(t, as, "agent_permit", map[string]any{"agent_id": target, "request_id": "perm-" + target, "decision": "deny"})
		switch {
		case want == "" && strings.Contains(text, "refused"):
			t.Errorf("agent a answering its child's request: %q", text)
		case want != "" && (!isErr || !strings.Contains(text, want)):
			t.Errorf("agent a answering %s's request: %q, want %s", target, text, want)
		}
	}
}

// A 5,000-character id in every argument that names something, for every
// tool: each call is refused by the schema's own pattern or length, and
// the connection the MCP endpoint shares stays open, so every other
// client is still answered.
func TestLongIDsAreRefusedAndMCPKeepsAnswering(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	s := fb.client(nil)
	long := strings.Repeat("x", 5000)
	tried := 0
	for tool, args := range advertisedArgs(t, s) {
		for _, a := range args {
			if a.kind != "string" || !slices.Contains([]string{"agent_id", "id", "node", "request_id"}, a.name) {
				continue
			}
			in := validArgs(args)
			in[a.name] = long
			text, isErr := call(t, s, tool, in)
			if !isErr || !strings.HasPrefix(text, "Invalid parameter(s): "+a.name+" must ") {
				t.Errorf("%s with a 5000-character %s: %q", tool, a.name, text)
			}
			tried++
		}
	}
	if tried < 12 {
		t.Errorf("only %d calls carried an id", tried)
	}
	if fb.f.Conn().IsClosed() {
		t.Fatalf("the endpoint's NATS connection was closed: %v", fb.f.Conn().LastError())
	}
	other := fb.client(nil)
	var nodes schemas.NodesReply
	ok(t, other, "agent_nodes", nil, &nodes)
	var list schemas.ListReply
	ok(t, other, "agent_list", nil, &list)
}

// A real claude agent, its recursion guard lifted, driven by the fake
// model: it cannot run, send to, close or read an agent a person opened
// on another node, nor open a child there; it can do each to its own
// child, on its own node. The parent's model answers the child's turns
// ("one", "two") by their text, and the parent's by its script.
func TestRealClaudeDrivesOnlyItsOwnSubtree(t *testing.T) {
	t.Parallel()
	cwd := t.TempDir()
	tool := func(name, args string) fakemodel.Reply {
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + name, Input: json.RawMessage(args)}}}
	}
	on := func(id string) string { return `"agent_id":"` + id + `"` }
	steps := []struct {
		reply   fakemodel.Reply
		refused bool
		want    string // in the tool's result
	}{
		{tool("agent_run", `{`+on("victim")+`,"text":"cat ~/.ssh/id_rsa"}`), true, "rule subtree"},
		{tool("agent_send", `{`+on("victim")+`,"text":"hello"}`), true, "rule subtree"},
		{tool("agent_close", `{`+on("victim")+`}`), true, "rule subtree"},
		{tool("agent_output", `{`+on("victim")+`}`), true, "rule subtree"},
		{tool("agent_events", `{`+on("victim")+`}`), true, "rule subtree"},
		{tool("agent_open", `{"cwd":"`+cwd+`","permission":"lab","id":"kid2","node":"n2"}`), true, "may not place its child on node n2: it runs on node n1, as that node's user"},
		{tool("agent_open", `{"cwd":"`+cwd+`","permission":"lab","id":"kid"}`), false, `"agent_id":"kid"`},
		{tool("agent_send", `{`+on("kid")+`,"text":"one"}`), false, `"turn":1`},
		{tool("agent_run", `{`+on("kid")+`,"text":"two"}`), false, "kid two"},
		{tool("agent_output", `{`+on("kid")+`,"which":"all"}`), false, "kid one"},
		{tool("agent_events", `{`+on("kid")+`}`), false, `"next_event"`},
		{tool("agent_close", `{`+on("kid")+`}`), false, `"closed":true`},
	}
	kidTurn := func(r fakemodel.Request) bool { return r.UserText == "one" || r.UserText == "two" }
	var parentAsked atomic.Int32
	mine := fakemodel.Start(t, fakemodel.Config{Default: func(r fakemodel.Request) fakemodel.Reply {
		if kidTurn(r) {
			return fakemodel.Reply{Text: "kid " + r.UserText}
		}
		if i := int(parentAsked.Add(1)) - 1; i < len(steps) {
			return steps[i].reply
		}
		return fakemodel.Reply{Text: "Done."}
	}})
	theirs := fakemodel.Start(t, fakemodel.Config{})
	fb, door := startRecordedFabric(t)
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fb.claudeBackend(mine)}})
	fb.runNode(node.Config{Name: "n2", Backends: []backend.Backend{fb.claudeBackend(theirs)}})
	ctx := t.Context()
	victim, err := fb.f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), Node: "n2", Permission: "bypass", ID: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	none := []string{}
	parent, err := fb.f.Open(ctx, schemas.OpenRequest{CWD: cwd, Node: "n1", Permission: "lab", DisallowedTools: &none})
	if err != nil {
		t.Fatal(err)
	}
	ran, err := fb.f.Run(ctx, schemas.RunRequest{AgentID: parent.AgentID, Text: "Reach for every agent you can.", Timeout: 240})
	if err != nil || ran.Text != "Done." {
		t.Fatalf("the parent's run: %+v %v", ran, err)
	}
	var reqs []fakemodel.Request
	for _, r := range mine.Requests() {
		if !kidTurn(r) {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) != len(steps)+1 {
		t.Fatalf("the parent's model was asked %d times: %s", len(reqs), toolResults(reqs))
	}
	for i, s := range steps {
		got := reqs[i+1].ToolResults
		if len(got) != 1 {
			t.Fatalf("step %d: %d tool results", i, len(got))
		}
		r := got[0]
		if r.IsError != s.refused || !strings.Contains(r.Content, s.want) || (s.refused && !strings.Contains(r.Content, "agent "+parent.AgentID+" may not")) {
			t.Errorf("step %d (%s): %+v, want refused %v with %q", i, s.reply.ToolCalls[0].Name, r, s.refused, s.want)
		}
	}
	// The door saw every call as the parent's.
	for _, c := range door.toolCalls() {
		if c.AgentID != parent.AgentID {
			t.Errorf("a tool call reached the door as %q", c.AgentID)
		}
	}
	// The victim ran nothing, and nothing ran on its node: no turn, no
	// request to that node's model.
	if rec, err := fb.f.Record(ctx, victim.AgentID); err != nil || rec.Turn != 0 || rec.Status == schemas.StatusDead {
		t.Errorf("the victim after the parent's attempts: %s %v", mustJSON(rec), err)
	}
	if n := len(theirs.Requests()); n != 0 {
		t.Errorf("the second node's model was asked %d times, want none", n)
	}
	if kid, err := fb.f.Record(ctx, "kid"); err != nil || kid.Node != "n1" {
		t.Errorf("the parent's child ran on node %q (%v), want its parent's n1", kid.Node, err)
	}
}

// An agent's open may name a fresh id or a dead agent of its own subtree;
// reopening any other dead id (another client's, or a dead parent whose
// children would then be its) is refused, since the id's stream, every
// earlier life, and its children's lineage would come with it.
func TestDoorRefusesReopeningAnotherAgentsID(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	work := t.TempDir()
	for _, r := range []struct {
		id, parent string
		status     schemas.AgentStatus
	}{{"boss", "", schemas.StatusDead}, {"worker", "boss", schemas.StatusIdle}, {"victim", "", schemas.StatusDead},
		{"a", "", schemas.StatusIdle}, {"deadkid", "a", schemas.StatusDead}} {
		putRecord(t, fb, schemas.AgentRecord{ID: r.id, Status: r.status, Node: "n9", Policy: free.Record(work), Parent: r.parent})
	}
	as := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	for _, id := range []string{"victim", "boss", "worker"} {
		text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": id})
		if !isErr || !strings.Contains(text, "agent_open refused: agent a may not reopen agent "+id) || !strings.Contains(text, "rule subtree") {
			t.Errorf("agent a reopening %s: %q", id, text)
		}
	}
	for _, id := range []string{"deadkid", "fresh"} {
		if text, _ := call(t, as, "agent_open", map[string]any{"cwd": work, "id": id}); strings.Contains(text, "refused") {
			t.Errorf("agent a opening %s: %q", id, text)
		}
	}
}

// derived is the agent id an open names when its caller chose none: the
// client derives it from the open's request id (client.derivedID), which
// the caller may choose.
func derived(requestID string) string {
	sum := sha256.Sum256([]byte("shoal-open/" + requestID))
	return hex.EncodeToString(sum[:4])
}

// An agent may not take over a dead agent outside its subtree by naming
// no id and choosing the request id whose derived id is the victim's:
// the door's reopen check looks at the id the call names, the client
// derives the id after it. Every agent opened without an id has such an
// 8-hex id; a request id that hashes to a given one takes some 2^32
// SHA-256s, here chosen the other way round (the victim is opened under
// the id the attacker's request id derives), which changes nothing of
// what the door sees. What comes with the id: its stream (the person's
// prompts), and its live children, which become the attacker's
// grandchildren to read and drive.
func TestDoorRefusesReopeningAnotherAgentsIDByItsRequestID(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	work := t.TempDir()
	person := fb.client(nil)
	chosen := "attacker-chosen-1"
	victim := derived(chosen)

	// A person's agent, its guard lifted; it runs a turn and opens a child
	// of its own; then the person closes it and the child goes on.
	var opened schemas.OpenReply
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": victim, "disallowed_tools": []string{}}, &opened)
	var ran schemas.RunReply
	ok(t, person, "agent_run", map[string]any{"agent_id": victim, "text": "the person's secret plan", "timeout": 30}, &ran)
	asVictim := fb.client(map[string]string{schemas.AgentIDHeader: victim})
	ok(t, asVictim, "agent_open", map[string]any{"cwd": work, "id": "vkid"}, &opened)
	var closed schemas.CloseReply
	ok(t, person, "agent_close", map[string]any{"agent_id": victim}, &closed)

	// Another client's agent, its guard lifted too: the victim is not of
	// its tree, and the door refuses it the id by name.
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "a", "disallowed_tools": []string{}}, &opened)
	as := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": victim}); !isErr || !strings.Contains(text, "rule subtree") {
		t.Fatalf("agent a reopening %s by name: %q", victim, text)
	}
	if text, _ := call(t, as, "agent_output", map[string]any{"agent_id": victim, "which": "all"}); !strings.Contains(text, "rule subtree") {
		t.Fatalf("agent a reading %s before: %q", victim, text)
	}

	// The same id by its request id.
	text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "request_id": chosen})
	if !isErr || !strings.Contains(text, "rule subtree") {
		t.Errorf("agent a opened under request id %q, which names the dead %s (another client's): %q, want a refusal by rule subtree", chosen, victim, text)
	}
	if rec, err := fb.f.Record(t.Context(), victim); err == nil && rec.Parent == "a" {
		t.Errorf("agent %s, the person's, is now agent a's child: %s", victim, mustJSON(rec))
	}
	if text, _ := call(t, as, "agent_output", map[string]any{"agent_id": victim, "which": "all"}); strings.Contains(text, "secret plan") {
		t.Errorf("agent a reads the person's turns of %s: %q", victim, text)
	}
	if text, isErr := call(t, as, "agent_send", map[string]any{"agent_id": "vkid", "text": "now work for me"}); !isErr {
		t.Errorf("agent a drives vkid, the person's agent's child: %q", text)
	}
}

// A dead agent's record is forgotten once its node keeps MaxDead newer
// dead ones, and its events leave the stream with its age or size limit;
// its children, alive or kept, still name it as their parent. An agent
// may not then open under that id and take them as its own: the id is
// not fresh, and what comes with it (the children, their streams, the
// right to drive them) was another client's.
func TestDoorRefusesAdoptingAForgottenAgentsChildren(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	fb.runNode(node.Config{Name: "n1", MaxDead: 1, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	ctx := t.Context()
	work := t.TempDir()
	person := fb.client(nil)
	var opened schemas.OpenReply
	var closed schemas.CloseReply

	// A person's agent opens a worker of its own, then is closed; the
	// worker goes on.
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "boss", "disallowed_tools": []string{}}, &opened)
	asBoss := fb.client(map[string]string{schemas.AgentIDHeader: "boss"})
	ok(t, asBoss, "agent_open", map[string]any{"cwd": work, "id": "worker"}, &opened)
	ok(t, person, "agent_close", map[string]any{"agent_id": "boss"}, &closed)
	// Another dead agent on the node: boss, the older, is forgotten.
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "filler"}, &opened)
	ok(t, person, "agent_close", map[string]any{"agent_id": "filler"}, &closed)
	poll.Until(t, 10*time.Second, "boss's record to be forgotten", func() bool {
		_, err := fb.f.Record(ctx, "boss")
		return schemas.CodeOf(err) == schemas.CodeNotFound
	})
	// Its events age out of the stream (here at once, as a small
	// --stream-max-bytes or the 7 days would).
	stream, err := fb.f.JetStream().Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(schemas.EventSubject("boss"))); err != nil {
		t.Fatal(err)
	}
	if rec, err := fb.f.Record(ctx, "worker"); err != nil || rec.Parent != "boss" || rec.Status == schemas.StatusDead {
		t.Fatalf("the worker: %s %v", mustJSON(rec), err)
	}

	// Another client's agent, its guard lifted.
	ok(t, person, "agent_open", map[string]any{"cwd": work, "id": "a", "disallowed_tools": []string{}}, &opened)
	as := fb.client(map[string]string{schemas.AgentIDHeader: "a"})
	if text, isErr := call(t, as, "agent_send", map[string]any{"agent_id": "worker", "text": "hello"}); !isErr || !strings.Contains(text, "rule subtree") {
		t.Fatalf("agent a sending to the worker before: %q", text)
	}
	text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "boss"})
	if !isErr || !strings.Contains(text, "refused") {
		t.Errorf("agent a opened under boss, whose worker is another client's: %q, want a refusal", text)
	}
	if text, isErr := call(t, as, "agent_send", map[string]any{"agent_id": "worker", "text": "now work for me"}); !isErr {
		t.Errorf("agent a drives the worker of the forgotten boss: %q", text)
	}
}

// An agent in namespaces of its own opens children in namespaces of their
// own: one asking for Landlock alone is refused, and one asking for no
// kind is refused by a node that gives Landlock alone (its children run
// on its node; this one's record says it gives no namespaces).
func TestDoorKeepsANamespacedAgentsChildrenInNamespaces(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	// The one node gives Landlock alone (its record, as a node on a
	// machine without namespaces advertises itself).
	putNode(t, fb, schemas.NodeRecord{Name: "weak", Sandbox: "landlock ABI 7", SandboxProblem: "this machine gives no namespaces"})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	work := t.TempDir()
	putRecord(t, fb, schemas.AgentRecord{ID: "boxed", Status: schemas.StatusIdle, Node: "weak", Policy: free.Record(work),
		Sandbox: &schemas.SandboxPolicy{Kernel: "namespaces, landlock ABI 7", Writable: []string{work}}})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "boxed"})
	text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "weaker", "sandbox_kind": "landlock"})
	if !isErr || !strings.Contains(text, "a child may not exceed its parent: agent boxed runs in namespaces of its own") {
		t.Errorf("a child asking for Landlock alone: %q, want the door's refusal", text)
	}
	text, isErr = call(t, as, "agent_open", map[string]any{"cwd": work, "id": "unsaid"})
	if !isErr || !strings.Contains(text, "node weak cannot take this agent: cannot put agents in namespaces of their own") {
		t.Errorf("a child asking for no kind, on a Landlock node: %q, want that node's refusal for giving no namespaces", text)
	}
	for _, id := range []string{"weaker", "unsaid"} {
		if rec, err := fb.f.Record(t.Context(), id); err == nil {
			t.Errorf("agent %s was opened: %s", id, mustJSON(rec))
		}
	}
}

// An agent allows for its descendants only what its own allowlist
// approves: a child opened with ask would otherwise run, on its parent's
// word, what the parent must ask a person for. Denying is always its to
// do, and a parent that skips every check may allow anything.
// A request whose record is not there is allowed by no other: the door
// let such an allow through unchecked.
func TestDoorHoldsAnAgentsAllowToItsAllowlist(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	gits, _ := schemas.ComposePolicy("", "", []string{"Bash(git *)", "Read"}, &none, false)
	bypass, _ := schemas.ComposePolicy("bypass", "", nil, &none, false)
	putRecord(t, fb, schemas.AgentRecord{ID: "gits", Status: schemas.StatusIdle, Node: "n9", Policy: gits.Record("/work")})
	putRecord(t, fb, schemas.AgentRecord{ID: "wild", Status: schemas.StatusIdle, Node: "n9", Policy: bypass.Record("/work")})
	_, js := natstest.JetStream(t, fb.b)
	kv, err := js.KeyValue(t.Context(), schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(kid, parent, request, tool string) {
		t.Helper()
		putRecord(t, fb, schemas.AgentRecord{ID: kid, Status: schemas.StatusIdle, Node: "n9", Policy: gits.Record("/work"), Parent: parent, Depth: 1})
		b, _ := json.Marshal(schemas.PermitRecord{AgentID: kid, RequestID: request, Node: "n9", Tool: tool, Input: json.RawMessage(`{}`)})
		if _, err := kv.Put(t.Context(), schemas.PermitKey(kid, request), b); err != nil {
			t.Fatal(err)
		}
	}
	ask("k1", "gits", "q-bash", "Bash")
	ask("k1", "gits", "q-read", "Read")
	ask("k1", "gits", "q-fetch", "WebFetch")
	ask("k2", "wild", "q-bash", "Bash")
	for _, c := range []struct {
		who, kid, request, decision, want string // want "": not refused by the door
	}{
		{"gits", "k1", "q-bash", "allow", "agent gits may not allow agent k1's Bash: Bash is not in this agent's allowlist"},
		{"gits", "k1", "q-fetch", "allow", "agent gits may not allow agent k1's WebFetch"},
		{"gits", "k1", "q-read", "allow", ""},
		{"gits", "k1", "q-bash", "deny", ""},
		{"wild", "k2", "q-bash", "allow", ""},
		// A request with no record (never asked, or its node's write of it
		// failed) says no tool to hold the allow to.
		{"gits", "k1", "q-unrecorded", "allow", "agent gits may not allow agent k1's request q-unrecorded: no such request is waiting"},
		{"gits", "k1", "q-unrecorded", "deny", ""},
		{"wild", "k2", "q-unrecorded", "allow", ""},
	} {
		s := fb.client(map[string]string{schemas.AgentIDHeader: c.who})
		text, isErr := call(t, s, "agent_permit", map[string]any{"agent_id": c.kid, "request_id": c.request, "decision": c.decision})
		switch {
		case c.want == "" && strings.Contains(text, "refused"):
			t.Errorf("%s answering %s's %s with %s: %q", c.who, c.kid, c.request, c.decision, text)
		case c.want != "" && (!isErr || !strings.Contains(text, c.want)):
			t.Errorf("%s answering %s's %s with %s: %q, want %q", c.who, c.kid, c.request, c.decision, text, c.want)
		}
	}
}

// A sandboxed agent's children reach no host its open did not let it
// reach: the bound is its record's sandbox_net, as the coordinator's side
// claimed it, not its sandbox's net, which its node writes (a confined
// node could widen that, and so what its agent's children on other nodes
// may reach).
func TestDoorHoldsAChildsHostsToItsParentsOpen(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	work := t.TempDir()
	putRecord(t, fb, schemas.AgentRecord{ID: "boxed", Status: schemas.StatusIdle, Node: "n9", Policy: free.Record(work),
		SandboxNet: []string{"pypi.org"},
		Sandbox: &schemas.SandboxPolicy{Kernel: "landlock ABI 7", Writable: []string{work},
			Net: []string{"api.anthropic.com:443", "pypi.org:443", "pypi.org:80", "exfil.example:443"}}})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "boxed"})
	text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "leaky", "sandbox_net": []string{"exfil.example:443"}})
	if !isErr || !strings.Contains(text, "a child may not exceed its parent: agent boxed may not reach exfil.example:443") {
		t.Errorf("a child asking for a host its node's record lists but its parent's open did not: %q, want the door's refusal", text)
	}
	if rec, err := fb.f.Record(t.Context(), "leaky"); err == nil {
		t.Errorf("agent leaky was opened: %s", mustJSON(rec))
	}
	text, _ = call(t, as, "agent_open", map[string]any{"cwd": work, "id": "pip", "sandbox_net": []string{"pypi.org:443"}})
	if strings.Contains(text, "may not reach") {
		t.Errorf("a child asking for a host its parent's open allowed: %q", text)
	}
}

// A sandboxed agent writes its directory: a subdirectory, or a file it
// names as a child's MCP config, it could swap for a link between the
// door's checks and the child's sandbox being made (or the config read
// by its node), which follow names; a child in a subdirectory came up
// with a sandbox writing outside its parent's directory. Its children
// take no MCP config, and their opens carry the directory their node
// opens theirs from (beneath: the family's first directory; see
// TestSandboxedAgentsChildInASubdirectory for the node's side). And a
// path the door cannot find (on the parent's node alone) keeps the child
// on that node.
func TestDoorKeepsASandboxedAgentsChildrenInItsOwnDirectory(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &none, false)
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(work, "mcp.json"), []byte(`{"mcpServers":{}}`), 0o644)
	putRecord(t, fb, schemas.AgentRecord{ID: "boxed", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(work),
		Sandbox: &schemas.SandboxPolicy{Kernel: "landlock ABI 7", Writable: []string{work}}})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "boxed"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "id": "withcfg", "mcp_config": filepath.Join(work, "mcp.json")}); !isErr || !strings.Contains(text, "its children take no mcp_config") {
		t.Errorf("a sandboxed agent's child with an mcp_config: %q, want the door's refusal", text)
	}
	// Past the door, to node n1 (a stand-in here that says what came):
	// in its directory or a subdirectory, held beneath its family's first
	// directory, which is its own (it has no sandboxed parent).
	putN1 := func(holds bool) {
		putNode(t, fb, schemas.NodeRecord{Name: "n1", Sandbox: "landlock ABI 7", SandboxHolds: holds})
	}
	// A node of an earlier version, which would take the child's
	// directory by name, gets no child in a subdirectory.
	putN1(false)
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": filepath.Join(work, "sub"), "node": "n1"}); !isErr || !strings.Contains(text, "does not hold a child's directory beneath its family's") {
		t.Errorf("a sandboxed agent's child in a subdirectory, on a node of an earlier version: %q, want the door's refusal", text)
	}
	putN1(true)
	opens := standInOpens(t, fb, "n1", 2)
	for _, cwd := range []string{work, filepath.Join(work, "sub")} {
		if text, _ := call(t, as, "agent_open", map[string]any{"cwd": cwd, "node": "n1"}); strings.Contains(text, "refused") {
			t.Errorf("a sandboxed agent's child in %s: %q", cwd, text)
		}
		select {
		case req := <-opens:
			if req.Beneath != work || req.Within != work || req.Sandbox == nil || !*req.Sandbox {
				t.Errorf("the open of a sandboxed agent's child in %s: beneath %q, within %q, sandbox %v; want both %s, sandboxed", cwd, req.Beneath, req.Within, req.Sandbox, work)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the open of a child in %s did not reach node n1", cwd)
		}
	}
	// Its children run on its node: the same path elsewhere is another
	// directory.
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "node": "n2"}); !isErr || !strings.Contains(text, "runs sandboxed on node n1: its children run there too") {
		t.Errorf("a sandboxed agent's child placed on another node: %q, want the door's refusal", text)
	}
	// Its sandboxed child's own child is held beneath the same first
	// directory, which the child in between could not rename.
	inner := filepath.Join(work, "sub")
	os.Mkdir(filepath.Join(inner, "deeper"), 0o755)
	putRecord(t, fb, schemas.AgentRecord{ID: "inner", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(inner), Parent: "boxed", Depth: 1,
		Sandbox: &schemas.SandboxPolicy{Kernel: "landlock ABI 7", Writable: []string{inner}}})
	call(t, fb.client(map[string]string{schemas.AgentIDHeader: "inner"}), "agent_open", map[string]any{"cwd": filepath.Join(inner, "deeper"), "node": "n1"})
	select {
	case req := <-opens:
		if req.Beneath != work || req.Within != inner {
			t.Errorf("the open of a sandboxed grandchild: beneath %q, within %q; want %s and %s", req.Beneath, req.Within, work, inner)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the open of a grandchild did not reach node n1")
	}
	// A family that cannot be traced (a parent's record gone) opens no
	// child: what lies below could have been renamed.
	putRecord(t, fb, schemas.AgentRecord{ID: "orphan", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(inner), Parent: "gone", Depth: 1,
		Sandbox: &schemas.SandboxPolicy{Kernel: "landlock ABI 7", Writable: []string{inner}}})
	if text, isErr := call(t, fb.client(map[string]string{schemas.AgentIDHeader: "orphan"}), "agent_open", map[string]any{"cwd": inner}); !isErr || !strings.Contains(text, "family cannot be traced") {
		t.Errorf("a sandboxed agent whose parent's record is gone opens a child: %q, want the door's refusal", text)
	}

	putRecord(t, fb, schemas.AgentRecord{ID: "far", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record("/on/n1/alone")})
	far := fb.client(map[string]string{schemas.AgentIDHeader: "far"})
	text, isErr := call(t, far, "agent_open", map[string]any{"cwd": "/on/n1/alone/sub", "id": "elsewhere", "node": "n2"})
	if !isErr || !strings.Contains(text, "is on node n1 alone") {
		t.Errorf("a child in a directory only its parent's node has, placed on another node: %q, want the door's refusal", text)
	}
	for _, id := range []string{"withcfg", "elsewhere"} {
		if rec, err := fb.f.Record(t.Context(), id); err == nil {
			t.Errorf("agent %s was opened: %s", id, mustJSON(rec))
		}
	}
}

// An agent that runs unsandboxed, as its node's user, has its children on
// that node too: one placed on another node (named, or by placement)
// would run as that node's user, with its files (its credentials, every
// agent token of its agents), in a directory of the same name that the
// parent never had. A directory the coordinator's machine also has
// placed the child anywhere before (outside attack: an agent on a node
// run as nobody opened a child on a node run as root, which read that
// node's credentials).
func TestDoorKeepsAnUnsandboxedAgentsChildrenOnItsNode(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	none := []string{}
	free, _ := schemas.ComposePolicy("bypass", "", nil, &none, false)
	work := t.TempDir() // on this machine too, as a shared home or the same container path is
	putRecord(t, fb, schemas.AgentRecord{ID: "loose", Status: schemas.StatusIdle, Node: "n1", Policy: free.Record(work)})
	as := fb.client(map[string]string{schemas.AgentIDHeader: "loose"})
	if text, isErr := call(t, as, "agent_open", map[string]any{"cwd": work, "node": "n2", "permission": "bypass"}); !isErr || !strings.Contains(text, "agent loose may not place its child on node n2: it runs on node n1, as that node's user") {
		t.Errorf("an unsandboxed agent's child placed on another node: %q, want the door's refusal", text)
	}
	// Placed by the door, not by placement: to n1 (a stand-in here that
	// says what came).
	putNode(t, fb, schemas.NodeRecord{Name: "n1"})
	putNode(t, fb, schemas.NodeRecord{Name: "n2"})
	opens := standInOpens(t, fb, "n1", 1)
	text, _ := call(t, as, "agent_open", map[string]any{"cwd": work, "permission": "bypass"})
	select {
	case req := <-opens:
		if req.Node != "n1" || req.Parent != "loose" {
			t.Errorf("an unsandboxed agent's child went to node %q (parent %q); want n1, loose", req.Node, req.Parent)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("an unsandboxed agent's child with no node named was not sent to its parent's node n1; the door said %q", text)
	}
}
