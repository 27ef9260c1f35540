package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node advertises the ACP agents it can run; placement sends acp:opencode
// to it, and the command line drives the agent like any other: run,
// set-model, output, close.
func TestACPAgentThroughTheFabric(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	fake.Script(fakemodel.Reply{Text: "hello over ACP"})
	dir := t.TempDir()
	env := append(peers.OpencodeEnv(t, filepath.Join(dir, "oc-home"), fake.URL()+"/v1"),
		"XDG_DATA_HOME="+dir+"/data", "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", "/nonexistent/claude", "--opencode", peers.Opencode.Command(t)[0], "--node-name", "acp-node")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node acp-node ready")
	must := func(args ...string) string {
		t.Helper()
		// opencode can take a while to start on a busy machine.
		args = append([]string{args[0], "--timeout", "3m"}, args[1:]...)
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d\n%s%s\nshoal up said:\n%s", args, code, out, errOut, up.stderrText())
		}
		return strings.TrimSpace(out)
	}
	listed := must("nodes", "--json")
	schematest.Control(t, "nodes_reply", []byte(listed))
	var nodes schemas.NodesReply
	if err := json.Unmarshal([]byte(listed), &nodes); err != nil {
		t.Fatal(err)
	}
	ready := false
	for _, b := range nodes.Nodes[0].Backends {
		ready = ready || (b.Kind == "acp" && b.Agent == "opencode" && b.Ready)
	}
	if !ready {
		t.Fatalf("the node does not advertise acp:opencode as ready: %+v", nodes.Nodes[0].Backends)
	}
	id := must("open", "--model", "acp:opencode", t.TempDir())
	if got := must("run", id, "say", "hello"); got != "hello over ACP" {
		t.Fatalf("run printed %q", got)
	}
	if got := must("set-model", id, "acp:opencode:fake/fake-model"); got != "switched to acp:opencode:fake/fake-model" {
		t.Fatalf("set-model printed %q", got)
	}
	if code, _, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, "set-model", id, "acp:gemini"); code != exitError || !strings.HasPrefix(errOut, "shoal set-model: not switched: ") {
		t.Fatalf("set-model to another ACP agent: exit %d, %q", code, errOut)
	}
	if got := must("output", id); got != "hello over ACP" {
		t.Fatalf("output printed %q", got)
	}
	must("close", id)
}
