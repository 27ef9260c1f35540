package node_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/schemas"
)

// The real opencode under permission ask (acp:opencode): its shell call
// waits for a person through Shoal's plugin, with the command as the
// request's input; a denial ends it with the person's message and the
// next call, allowed, runs. Its reads are not asked about.
func TestRealOpencodeAsks(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	cwd := t.TempDir()
	os.WriteFile(filepath.Join(cwd, "notes.txt"), []byte("read me"), 0o644)
	shell := func(cmd string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: in}}}
	}
	readIn, _ := json.Marshal(map[string]string{"filePath": filepath.Join(cwd, "notes.txt")})
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "read", Input: readIn}}},
		shell("touch denied.txt"),
		shell("touch allowed.txt"),
		fakemodel.Reply{Text: "Both tried."},
	)
	be := acp.New(acp.Config{Commands: map[string][]string{acp.AgentOpencode: append(peers.Opencode.Command(t), "acp")},
		Env: peers.OpencodeEnv(t, t.TempDir(), fake.URL()+"/v1"), StopWait: time.Second})
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(cfg *node.Config) { cfg.Backends = append(cfg.Backends, be) }})
	opened, err := f.fabric.Open(f.ctx(3*time.Minute), schemas.OpenRequest{Model: "acp:opencode", Permission: "ask", CWD: cwd, Node: "n1"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	id := opened.AgentID
	if _, err := f.fabric.Send(f.ctx(time.Minute), schemas.SendRequest{AgentID: id, Text: "Try both."}); err != nil {
		t.Fatal(err)
	}
	next := func(want string) schemas.PermitRecord {
		t.Helper()
		var got []schemas.PermitRecord
		poll.Until(t, 2*time.Minute, "a request for "+want, func() bool {
			all, _ := f.fabric.Pending(f.ctx(10 * time.Second))
			got = all.Requests
			return len(got) == 1
		})
		if got[0].Tool != "bash" || got[0].AgentID != id {
			t.Fatalf("the request: %+v", got[0])
		}
		var in map[string]any
		json.Unmarshal(got[0].Input, &in)
		if in["command"] != want {
			t.Fatalf("the request's input: %s, want the command %q", got[0].Input, want)
		}
		return got[0]
	}
	r1 := next("touch denied.txt")
	if _, err := f.fabric.Permit(f.ctx(10*time.Second), schemas.PermitRequest{AgentID: id, RequestID: r1.RequestID, Decision: schemas.DecisionDeny, Message: "not that one", By: "test"}); err != nil {
		t.Fatal(err)
	}
	r2 := next("touch allowed.txt")
	if _, err := f.fabric.Permit(f.ctx(10*time.Second), schemas.PermitRequest{AgentID: id, RequestID: r2.RequestID, Decision: schemas.DecisionAllow, By: "test"}); err != nil {
		t.Fatal(err)
	}
	var out schemas.OutputReply
	deadline := time.Now().Add(2 * time.Minute)
	for out, err = f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id}); err != nil || out.Text != "Both tried."; out, err = f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: id}) {
		if time.Now().After(deadline) {
			t.Fatalf("the turn did not end: %+v %v; the model was asked %d times", out, err, len(fake.Requests()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(cwd, "denied.txt")); err == nil {
		t.Error("the denied command ran")
	}
	if _, err := os.Stat(filepath.Join(cwd, "allowed.txt")); err != nil {
		t.Errorf("the allowed command did not run: %v", err)
	}
	var denied bool
	for _, q := range fake.Requests() {
		for _, r := range q.ToolResults {
			denied = denied || (r.Name == "bash" && strings.Contains(r.Content, "not that one"))
		}
	}
	if !denied {
		t.Errorf("no tool result carries the person's message; the model was told: %s", mustJSON(fake.Requests()[len(fake.Requests())-1].ToolResults))
	}
}
