package schemas_test

import (
	"encoding/json"
	"io/fs"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// controlSamples pairs each control schema with a populated Go value.
func controlSamples() map[string]any {
	turn, max := 2, 100
	none := []string{}
	c1, c2 := strings.Repeat("a1", 20), strings.Repeat("b2", 20)
	yes := true
	ws := &schemas.Workspace{Repo: c1, Source: "/home/me/proj", Ref: "HEAD", Base: c1, Commit: c2, WithChanges: true,
		Bundle: c1 + "/" + c2 + "-0123456789abcdef.bundle", Branch: "shoal/9f3a1c20", Resume: c2}
	record := schemas.AgentRecord{ID: "9f3a1c20", Status: schemas.StatusIdle, Model: "sonnet/high", CWD: "/p", Turn: 2,
		CreatedAt: 1.7566e9, LastActivity: 1.7566e9, EventLog: "/c/9f3a1c20.events.jsonl", Node: "n1", Workspace: ws}
	recordJSON, _ := json.Marshal(record)
	return map[string]any{
		"open_request": schemas.OpenRequest{RequestID: "r1", CWD: "/p", Model: "sonnet", Effort: "low", Permission: "default",
			PermissionMode: "plan", AllowedTools: []string{"Read"}, Only: true, DisallowedTools: &none, MCPConfig: "/m.json",
			SystemPrompt: "be brief", ID: "nb-1", Node: "n1", Labels: map[string]string{"gpu": "yes"}, Workspace: ws,
			Repo: true, Ref: "main", WithChanges: true, BudgetTokens: 10000, BudgetUSD: 2.5},
		"repo_has_request": schemas.RepoHasRequest{Repo: c1, Commit: c2},
		"repo_has_reply":   schemas.RepoHasReply{Has: false, Haves: []string{c1}},
		"diff_request":     schemas.DiffRequest{AgentID: "9f3a1c20", Stat: true},
		"diff_reply":       schemas.DiffReply{Diff: "diff --git a/x b/x\n", Base: c1, Files: 1},
		"job_request": schemas.JobRequest{JobID: "9f3a1c20", CWD: "/home/me/proj", Prompt: "Fix it.", Then: []string{"Test it."}, Ref: "main",
			WithChanges: true, Model: "sonnet", Permission: "auto", Node: "n1", Labels: map[string]string{"gpu": "yes"}, Sandbox: &yes, Timeout: 60, Detach: true},
		"job_record": schemas.JobRecord{ID: "9f3a1c20", Status: schemas.JobSucceeded, Repo: "/home/me/proj", Runner: "laptop", Node: "n1",
			Turns: []string{"Fix it."}, Done: 1, StartedAt: 1.7566e9, EndedAt: 1.7566e9 + 30, Beat: 1.7566e9 + 30, Branch: "shoal/9f3a1c20", Tip: c2,
			Commits: 1, Files: 2, Stat: " a | 1 +\n", Usage: &schemas.Usage{InputTokens: 10, OutputTokens: 3}, Error: "the turn failed: x"},
		"fetch_request":       schemas.FetchRequest{AgentID: "9f3a1c20", Into: "/home/me/proj"},
		"fetch_reply":         schemas.FetchReply{Branch: "shoal/9f3a1c20", Tip: c2, Base: c1, Commits: 2, Files: 1, Into: "/home/me/proj"},
		"work_request":        schemas.WorkRequest{AgentID: "9f3a1c20", Haves: []string{c1}},
		"work_reply":          schemas.WorkReply{Bundle: c1 + "/" + c2 + ".bundle", Tip: c2, Base: c1, Branch: "shoal/9f3a1c20", Commits: 2, Files: 1},
		"open_reply":          schemas.OpenReply{AgentID: "9f3a1c20", Node: "n1"},
		"send_request":        schemas.SendRequest{RequestID: "r2", AgentID: "9f3a1c20", Text: "hi"},
		"status_request":      schemas.StatusRequest{AgentID: "9f3a1c20"},
		"nodes_request":       schemas.NodesRequest{},
		"send_reply":          schemas.SendReply{Turn: 1},
		"run_request":         schemas.RunRequest{RequestID: "r3", AgentID: "9f3a1c20", Text: "hi", Timeout: 30},
		"run_reply":           schemas.RunReply{Text: "hello"},
		"output_request":      schemas.OutputRequest{AgentID: "9f3a1c20", Turn: &turn, Which: schemas.WhichFullTurn, IncludeTools: true, MaxChars: &max},
		"output_reply":        schemas.OutputReply{AgentID: "9f3a1c20", Turn: 2, Status: schemas.StatusIdle, Done: true, Which: "full_turn", Text: "x", Usage: &schemas.Usage{}},
		"agent_request":       schemas.AgentRequest{RequestID: "r4", AgentID: "9f3a1c20"},
		"agent_record":        record,
		"list_request":        schemas.ListRequest{},
		"fabric_list_request": schemas.FabricListRequest{Paged: true, After: "9f3a1c20"},
		"list_reply":          schemas.ListReply{Agents: []schemas.AgentRecord{record}},
		"interrupt_reply":     schemas.InterruptReply{Interrupted: true},
		"close_reply":         schemas.CloseReply{Closed: true},
		"set_model_request":   schemas.SetModelRequest{RequestID: "r5", AgentID: "9f3a1c20", Model: "acp:opencode:x/y"},
		"permit_request":      schemas.PermitRequest{AgentID: "9f3a1c20", RequestID: "perm-1", Decision: schemas.DecisionDeny, Option: "reject_once", Message: "not now", By: "mcp"},
		"pending_request":     struct{}{},
		"set_model_reply":     schemas.SetModelReply{Switched: true},
		"error_reply":         schemas.ErrorReply{Error: schemas.Errf(schemas.CodeNotFound, "no such agent: %s", "x")},
		"events_request":      schemas.EventsRequest{AgentID: "a", FromEvent: 3, FromTurn: 2, Since: "2026-11-29T10:00:00Z", Max: 10, IncludeDeltas: true},
		"events_reply": schemas.EventsReply{AgentID: "a", NextEvent: 4, More: true,
			Events: []schemas.StoredEvent{{N: 3, Time: "2026-11-29T10:00:00Z", Node: "n1", Event: json.RawMessage(`{"kind":"turn_started","turn":1,"data":{}}`)}},
			Gaps:   []schemas.EventGap{{From: 1, To: 2}}},
		"nodes_reply":          schemas.NodesReply{Nodes: []schemas.NodeRecord{sampleNode}, Next: "n0"},
		"fabric_nodes_request": schemas.FabricNodesRequest{Paged: true, After: "n0"},
		"node_record":          sampleNode,
		"replay_request":       schemas.ReplayRequest{Agents: []string{"a"}, FromEvent: 3, FromTurn: 2, Since: "2026-11-29T10:00:00Z", New: true, Follow: true},
		"relay_hello_reply":    schemas.RelayHelloReply{NameTaken: true, NodeTTLMS: 15000, TakesAcked: true, Grants: true, MCP: &schemas.MCPGrant{URL: "http://10.0.0.1:7270/mcp", Key: schemas.NodeKey("t", "n1")}},
		"relay_grant_reply":    schemas.RelayGrantReply{MCP: &schemas.MCPGrant{URL: "http://10.0.0.1:7270/mcp", Key: schemas.NodeKey("t", "n1")}},
		"relay_entry":          schemas.RelayEntry{Found: true, Revision: 3, Value: recordJSON},
		"relay_owned_reply":    schemas.RelayOwnedReply{Records: []schemas.RelayEntry{{Found: true, Revision: 3, Value: recordJSON}}, Next: "9f3a1c20"},
		"relay_owned_request":  schemas.RelayOwnedRequest{Paged: true, After: "9f3a1c20", Max: 1 << 20},
		"relay_last_request":   schemas.RelayLastRequest{Agents: []string{"9f3a1c20"}},
		"budget_request":       schemas.BudgetRequest{AgentID: "9f3a1c20", Fleet: true, Label: "gpu=yes", Tokens: 1000, USD: 2.5},
		"budgets_request":      schemas.BudgetsRequest{Paged: true, After: "9f3a1c20"},
		"budgets_reply": schemas.BudgetsReply{
			Budgets: []schemas.BudgetLine{{AgentID: "9f3a1c20", Fleet: true, Label: "gpu=yes", Budget: schemas.Budget{Tokens: 1000, USD: 2.5}, Used: schemas.Usage{InputTokens: 10, CostUSD: schemas.Cost(0.5)}}},
			Spent:   schemas.Spent{Seq: 42, Rows: []schemas.SpentRow{{Node: "n1", Instance: "0123abcd", Model: "sonnet", Labels: []string{"gpu=yes"}, Turns: 3, Usage: schemas.Usage{InputTokens: 10}}}}},
		"relay_last_reply": schemas.RelayLastReply{Last: map[string]uint64{"9f3a1c20": 42}, Tails: map[string]schemas.Tail{"9f3a1c20": {Last: 42, Turn: 3, Open: true, Errored: true}}},
	}
}

// Every control schema file has a Go type, their field names agree, and a
// populated value validates.
func TestControlSchemasMatchGoTypes(t *testing.T) {
	files, err := fs.Glob(schemas.JSONSchemas, "jsonschema/control/*.json")
	if err != nil {
		t.Fatal(err)
	}
	samples := controlSamples()
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(f, "jsonschema/control/"), ".json"))
	}
	var goNames []string
	for n := range samples {
		goNames = append(goNames, n)
	}
	sort.Strings(names)
	sort.Strings(goNames)
	if !slices.Equal(names, goNames) {
		t.Fatalf("schema files %v, Go samples %v", names, goNames)
	}
	for name, v := range samples {
		raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/"+name+".json")
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var props []string
		for p := range schema.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		if fields := jsonFields(reflect.TypeOf(v)); !slices.Equal(props, fields) {
			t.Errorf("%s: schema properties %v, Go fields %v", name, props, fields)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		schematest.Control(t, name, b)
	}
}

func TestControlSchemasRejectBadInput(t *testing.T) {
	bad := map[string]string{
		"open_request":      `{"model":"sonnet"}`,
		"send_request":      `{"agent_id":"BAD ID","text":"x"}`,
		"run_request":       `{"agent_id":"a","text":"x","timeout":-1}`,
		"output_request":    `{"agent_id":"a","which":"everything"}`,
		"set_model_request": `{"agent_id":"a"}`,
		"permit_request":    `{"agent_id":"a","request_id":"p","decision":"maybe"}`,
		"error_reply":       `{"error":{"code":"oops","message":"m"}}`,
		"agent_request":     `{"agent_id":"a","extra":1}`,
	}
	for name, in := range bad {
		if err := schematest.Validate("control/"+name, []byte(in)); err == nil {
			t.Errorf("%s accepted %s", name, in)
		}
	}
}

func TestDecodeReply(t *testing.T) {
	var ok schemas.SendReply
	if err := schemas.DecodeReply([]byte(`{"turn":3}`), &ok); err != nil || ok.Turn != 3 {
		t.Fatalf("got %+v %v", ok, err)
	}
	err := schemas.DecodeReply([]byte(`{"error":{"code":"not_found","message":"no such agent: x"}}`), &ok)
	if schemas.CodeOf(err) != schemas.CodeNotFound || err.Error() != "no such agent: x" {
		t.Fatalf("got %v (code %s)", err, schemas.CodeOf(err))
	}
	if err := schemas.DecodeReply([]byte(`nope`), &ok); err == nil || schemas.CodeOf(err) != schemas.CodeInternal {
		t.Fatalf("garbage reply gave %v", err)
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

var sampleNode = schemas.NodeRecord{
	Name: "n1", Version: "0.1.0", Instance: "c0ffee", Labels: map[string]string{"gpu": "yes"},
	Backends: []schemas.BackendInfo{
		{Kind: "claude", Path: "/usr/bin/claude", Version: "2.1.197", Ready: true},
		{Kind: "ollama", Host: "http://127.0.0.1:11434", Models: []string{"qwen3:8b"}, Ready: true},
		{Kind: "acp", Agent: "gemini", Problem: "gemini was not found", Ready: false},
	},
	Host:   schemas.HostInfo{Hostname: "box", OS: "linux", Arch: "amd64", CPUs: 2, MemoryBytes: 1 << 30, GPUs: []string{}},
	Agents: 1, MaxAgents: 4, StartedAt: 1.5e9, Heartbeat: 1.5e9, Git: "2.39.5",
}
