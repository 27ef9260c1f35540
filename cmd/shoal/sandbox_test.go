package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/proctest"
	"github.com/shoalfabric/shoal/schemas"
)

// A sandboxed claude agent with sandbox_net, through the whole fabric: a
// direct connect to a loopback port not on its list fails and reaches
// nothing; a request through its proxy to a host not on the list is
// refused, over CONNECT and in absolute form; a host on the list answers
// through the proxy; the model and Shoal's MCP endpoint work.
func TestSandboxNet(t *testing.T) {
	t.Parallel()
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "answered through the proxy")
	}))
	t.Cleanup(allowed.Close)
	forbidden, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forbidden.Close() })
	var reached atomic.Int32
	go func() {
		for {
			c, err := forbidden.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()
	forbiddenPort := forbidden.Addr().(*net.TCPAddr).Port
	allowedHost := strings.TrimPrefix(allowed.URL, "http://")

	c := startCoordinator(t, nil)
	fake, must := c.fake, c.must
	bash := func(cmd string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	fake.Script(
		bash(fmt.Sprintf("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d' && echo CONNECTED", forbiddenPort)),
		bash("curl -sS https://not-on-the-list.example/ 2>&1; curl -s -o /dev/null -w 'plain=%{http_code}' http://not-on-the-list.example/"),
		bash("curl -sS "+allowed.URL+"/"),
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: schemas.MCPToolPrefix + "agent_status", Input: json.RawMessage(`{"agent_id":"boxed"}`)}}},
		fakemodel.Reply{Text: "Probed."},
	)
	cwd := t.TempDir()
	id := must("open", "--id", "boxed", "--permission", "bypass", "--allow-nested", "--sandbox", "--sandbox-net", allowedHost, cwd)
	if out := must("run", id, "Probe the network."); out != "Probed." {
		t.Fatalf("run: %q", out)
	}
	reqs := fake.Requests()
	if len(reqs) != 5 {
		t.Fatalf("the model was asked %d times: %s", len(reqs), mustJSONText(reqs))
	}
	result := func(i int) fakemodel.ToolResult {
		t.Helper()
		if len(reqs[i].ToolResults) != 1 {
			t.Fatalf("request %d has %d tool results", i, len(reqs[i].ToolResults))
		}
		return reqs[i].ToolResults[0]
	}
	if r := result(1); strings.Contains(r.Content, "CONNECTED") || !strings.Contains(strings.ToLower(r.Content), "permission denied") || reached.Load() != 0 {
		t.Errorf("the direct connect to port %d: %+v; the port saw %d connections", forbiddenPort, r, reached.Load())
	}
	if r := result(2); !strings.Contains(r.Content, "403") || !strings.Contains(r.Content, "plain=403") {
		t.Errorf("the hosts not on the list: %+v", r)
	}
	if r := result(3); r.IsError || !strings.Contains(r.Content, "answered through the proxy") {
		t.Errorf("the host on the list: %+v", r)
	}
	if r := result(4); r.IsError || !strings.Contains(r.Content, `"id":"boxed"`) {
		t.Errorf("agent_status through the MCP endpoint: %+v", r)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal([]byte(must("status", "--json", id)), &rec); err != nil || rec.Sandbox == nil {
		t.Fatalf("status: %+v %v", rec, err)
	}
	if !strings.Contains(strings.Join(rec.Sandbox.Net, " "), allowedHost) {
		t.Errorf("the record's net %v lacks %s", rec.Sandbox.Net, allowedHost)
	}
}

// onlyToolResult is what the one tool call answered in the model's last
// request; it fails unless there is exactly one.
func onlyToolResult(t *testing.T, fake *fakemodel.Server) string {
	t.Helper()
	reqs := fake.Requests()
	got := reqs[len(reqs)-1].ToolResults
	if len(got) != 1 {
		t.Fatalf("tool results: %+v", got)
	}
	return got[0].Content
}

func mustJSONText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A sandboxed agent's shell tries to get out through Shoal's own MCP
// endpoint: straight to its port (the kernel refuses the connect), and
// through its proxy claiming to be no agent at all, asking for an
// unsandboxed bypass child. The proxy tells the door who it is, and the
// door keeps a sandboxed agent's children sandboxed: nothing is opened.
func TestSandboxedAgentCannotEscapeThroughMCP(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	fake, must, endpoint := c.fake, c.must, c.printed("MCP endpoint ")
	cwd := t.TempDir()
	post := `curl -s -X POST "$HTTP_PROXY/mcp" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -H 'X-Shoal-Agent-Id: ' -H 'Authorization: Bearer forged'`
	script := `curl -s --noproxy '*' -o /dev/null ` + endpoint + `; echo "direct=$?"
sid=$(` + post + ` -D - -o /dev/null -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"escape","version":"0"}}}' | tr -d '\r' | sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: //p')
` + post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
` + post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"agent_open","arguments":{"cwd":"` + cwd + `","permission":"bypass","sandbox":false}}}'
`
	if err := os.WriteFile(filepath.Join(cwd, "escape.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]string{"command": "sh escape.sh", "description": "leave"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Stayed."})
	id := must("open", "--permission", "bypass", "--allow-nested", "--sandbox", cwd)
	if out := must("run", id, "Get out."); out != "Stayed." {
		t.Fatalf("run: %q", out)
	}
	out := onlyToolResult(t, fake)
	if !strings.Contains(out, "direct=7") {
		t.Errorf("a connect straight to the MCP endpoint was not refused:\n%s", out)
	}
	if !strings.Contains(out, "agent_open refused") || !strings.Contains(out, "runs sandboxed, so its children do too") {
		t.Errorf("the door did not know the agent, or let an unsandboxed child through:\n%s", out)
	}
	if ls := must("ls"); strings.Count(ls, "\n") > 1 {
		t.Errorf("an agent was opened:\n%s", ls)
	}
}

// From inside a sandboxed real claude agent, its own Bash tool tries
// Shoal's side doors through its proxy: the dashboard's API (an open of
// an unsandboxed bypass agent among them), its pages and the metrics are
// refused with 403 and the rule, and the metrics port itself cannot be
// dialled. $HTTP_PROXY/mcp works, as that agent: it reads its own record
// and is refused another agent's. Nothing is opened.
func TestSandboxedAgentReachesOnlyTheMCPEndpoint(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil, "--metrics", "127.0.0.1:0", "--monitor", "127.0.0.1:0")
	fake, must, metrics := c.fake, c.must, c.printed("metrics ")
	monitor, _, _ := strings.Cut(c.printed("NATS monitoring "), " ")
	other := must("open", "--id", "other", t.TempDir())
	cwd := t.TempDir()
	mcpPost := `curl -s -X POST "$HTTP_PROXY/mcp" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'`
	script := `for p in api/fleet api/agents/other agents/other "" api/whoami metrics; do
  curl -s -o body -w "GET /$p=%{http_code} " "$HTTP_PROXY/$p"; head -c 400 body; echo
done
curl -s -o body -w "POST /api/open=%{http_code} " -X POST "$HTTP_PROXY/api/open" -H 'Content-Type: application/json' -d '{"cwd":"/","permission":"bypass","sandbox":false}'; head -c 400 body; echo
curl -s --noproxy '*' -o /dev/null ` + metrics + `; echo "metrics-direct=$?"
curl -s --noproxy '*' -o /dev/null ` + monitor + `/varz; echo "monitor-direct=$?"
sid=$(` + mcpPost + ` -D - -o /dev/null -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"inside","version":"0"}}}' | tr -d '\r' | sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: //p')
` + mcpPost + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
echo "self: $(` + mcpPost + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"agent_status","arguments":{"agent_id":"inside"}}}')"
echo "other: $(` + mcpPost + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"agent_status","arguments":{"agent_id":"` + other + `"}}}')"
`
	if err := os.WriteFile(filepath.Join(cwd, "doors.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]string{"command": "sh doors.sh", "description": "try the doors"})
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Tried."})
	id := must("open", "--id", "inside", "--permission", "bypass", "--allow-nested", "--sandbox", cwd)
	if out := must("run", id, "Try every door."); out != "Tried." {
		t.Fatalf("run: %q", out)
	}
	out := onlyToolResult(t, fake)
	t.Logf("inside the sandbox:\n%s", out)
	for _, door := range []string{"GET /api/fleet", "GET /api/agents/other", "GET /agents/other", "GET /", "GET /api/whoami", "GET /metrics", "POST /api/open"} {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, door+"=") {
				line = l
			}
		}
		if !strings.HasPrefix(line, door+"=403 ") || !strings.Contains(line, "rule side-doors") {
			t.Errorf("%s from inside: %q, want 403 naming rule side-doors", door, line)
		}
	}
	if !strings.Contains(out, "metrics-direct=7") {
		t.Errorf("a direct connect to the metrics port was not refused:\n%s", out)
	}
	if !strings.Contains(out, "monitor-direct=7") {
		t.Errorf("a direct connect to the NATS monitoring port was not refused:\n%s", out)
	}
	if res, err := http.Get(monitor + "/varz"); err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("the NATS monitoring from outside the sandbox: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	if !strings.Contains(out, `self: `) || !strings.Contains(out, `\"id\":\"inside\"`) {
		t.Errorf("the agent's MCP call about itself through its proxy:\n%s", out)
	}
	if !strings.Contains(out, "agent_status refused: agent inside may not read the status of agent "+other+" (not of its tree): rule subtree") {
		t.Errorf("the agent's MCP call about another agent:\n%s", out)
	}
	if ls := must("ls"); strings.Count(ls, "\n") > 2 {
		t.Errorf("an agent was opened:\n%s", ls)
	}
}

// A daemon a sandboxed agent's own Bash tool detaches, the way that
// escapes a tree found by its environment (`setsid env -i sleep N &`),
// ends within 2 s of the agent's close, of the agent's death, and of its
// node's SIGKILL: it is in the agent's pid namespace, which ends with it.
func TestSandboxedDaemonEndsWithTheAgent(t *testing.T) {
	t.Parallel()
	for i, end := range []string{"close", "death", "node SIGKILL"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			c := startCoordinator(t, nil)
			arg := fmt.Sprintf("%d", 7761+i)
			in, _ := json.Marshal(map[string]string{"command": "(setsid env -i sleep " + arg + " > /dev/null 2>&1 < /dev/null &); echo detached", "description": "detach"})
			c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Detached."})
			id := c.must("open", "--permission", "bypass", "--sandbox", t.TempDir())
			if out := c.must("run", id, "Leave something running."); out != "Detached." {
				t.Fatalf("run: %q", out)
			}
			var daemon int
			poll.Until(t, 10*time.Second, "the daemon runs", func() bool {
				daemon = proctest.Sleep(arg)
				return daemon > 0
			})
			switch end {
			case "close":
				c.must("close", id)
			case "death":
				var pids map[string]struct {
					PID int `json:"pid"`
				}
				b, err := os.ReadFile(filepath.Join(c.dir, "cache", "shoal", "agents", "n", "pids.json"))
				if err != nil || json.Unmarshal(b, &pids) != nil || pids[id].PID == 0 {
					t.Fatalf("the agent's pid: %s %v", b, err)
				}
				if err := syscall.Kill(pids[id].PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			case "node SIGKILL":
				c.up.stop(syscall.SIGKILL)
			}
			poll.Until(t, 2*time.Second, "the detached daemon to end with the agent ("+end+")", func() bool {
				return syscall.Kill(daemon, 0) == syscall.ESRCH || processState(daemon) == "Z"
			})
		})
	}
}

// A node whose sandbox kind is landlock gives Landlock and seccomp alone
// even where namespaces could be had, and says so: one line when it
// starts, its record's sandbox without "namespaces" and with the reason;
// an open that asks for namespaces is refused with it, one that asks for
// landlock runs in the node's own pid namespace. A default node's record
// says namespaces.
func TestNodeSandboxKindLandlock(t *testing.T) {
	t.Parallel()
	plain := startCoordinator(t, nil)
	var nodes schemas.NodesReply
	if err := json.Unmarshal([]byte(plain.must("nodes", "--json")), &nodes); err != nil || len(nodes.Nodes) != 1 {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	if !strings.HasPrefix(nodes.Nodes[0].Sandbox, schemas.SandboxNamespaces+", landlock ABI ") {
		t.Errorf("a default node's sandbox: %q (%s)", nodes.Nodes[0].Sandbox, nodes.Nodes[0].SandboxProblem)
	}

	c := startCoordinator(t, nil, "--sandbox-kind", "landlock")
	if err := json.Unmarshal([]byte(c.must("nodes", "--json")), &nodes); err != nil || len(nodes.Nodes) != 1 {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	if n := nodes.Nodes[0]; !strings.HasPrefix(n.Sandbox, "landlock ABI ") || !strings.Contains(n.SandboxProblem, "sandbox kind is landlock") {
		t.Errorf("the landlock node's record: sandbox %q, problem %q", n.Sandbox, n.SandboxProblem)
	}
	if said := c.up.stderrText(); strings.Count(said, "without namespaces of their own") != 1 {
		t.Errorf("the node did not say once that its agents get no namespaces:\n%s", said)
	}
	code, _, errOut := c.shoal("open", "--sandbox-kind", "namespaces", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "cannot put agents in namespaces of their own") || !strings.Contains(errOut, "sandbox kind is landlock") {
		t.Errorf("an open asking for namespaces: exit %d: %s", code, errOut)
	}
	in, _ := json.Marshal(map[string]string{"command": "readlink /proc/self/ns/pid", "description": "which pid namespace"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Looked."})
	id := c.must("open", "--sandbox-kind", "landlock", "--permission", "bypass", t.TempDir())
	if out := c.must("run", id, "Which pid namespace?"); out != "Looked." {
		t.Fatalf("run: %q", out)
	}
	mine, _ := os.Readlink("/proc/self/ns/pid")
	reqs := c.fake.Requests()
	if r := reqs[len(reqs)-1]; len(r.ToolResults) != 1 || !strings.Contains(r.ToolResults[0].Content, mine) {
		t.Errorf("the landlock agent's pid namespace: %+v; the node's is %s", r.ToolResults, mine)
	}
}

// A sandboxed agent opens a child in a subdirectory of its directory
// through its MCP endpoint: the child comes up sandboxed, held beneath
// its parent's directory, writing its own directory and not its
// parent's; a child through a link out of it is refused. (Until
// 2026-12-05 a sandboxed agent's children worked in its own directory
// only: the parent could swap the subdirectory for a link while the
// child's sandbox was made by name. The node now opens it from the
// family's first directory through no link:
// TestConfinementHoldsItsDirectoryBeneathWhileSwapped.)
func TestSandboxedAgentsChildInASubdirectory(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	fake, must := c.fake, c.must
	cwd := t.TempDir()
	sub := filepath.Join(cwd, "sub")
	post := `curl -s -X POST "$HTTP_PROXY/mcp" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'`
	open := func(dir string) string {
		return post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"agent_open","arguments":{"cwd":"` + dir + `","permission":"bypass"}}}'; echo`
	}
	script := `mkdir sub && ln -s /etc esc
sid=$(` + post + ` -D - -o /dev/null -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"parent","version":"0"}}}' | tr -d '\r' | sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: //p')
` + post + ` -H "Mcp-Session-Id: $sid" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
echo "sub: $(` + open(sub) + `)"
echo "esc: $(` + open(filepath.Join(cwd, "esc")) + `)"
`
	if err := os.WriteFile(filepath.Join(cwd, "open.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	bash := func(cmd string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": cmd, "description": "work"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	fake.Script(bash("sh open.sh"), fakemodel.Reply{Text: "Opened."})
	parent := must("open", "--permission", "bypass", "--allow-nested", "--sandbox", cwd)
	if out := must("run", parent, "Open a child in sub."); out != "Opened." {
		t.Fatalf("run: %q", out)
	}
	opened := onlyToolResult(t, fake)
	if out := opened; !strings.Contains(out, `esc: `) || !strings.Contains(out, "outside this agent's workspace") {
		t.Errorf("a child through a link out of the sandboxed parent's directory was not refused:\n%s", out)
	}
	var list schemas.ListReply
	if err := json.Unmarshal([]byte(must("ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	var child *schemas.AgentRecord
	for i, r := range list.Agents {
		if r.Policy.CWD == sub {
			child = &list.Agents[i]
		}
		if strings.HasPrefix(r.Policy.CWD, "/etc") {
			t.Errorf("a child was opened in %s", r.Policy.CWD)
		}
	}
	if child == nil {
		t.Fatalf("no child in %s: %s\n%s", sub, mustJSONText(list), opened)
	}
	if child.Sandbox == nil || child.Parent != parent || !slices.Contains(child.Sandbox.Writable, sub) || slices.Contains(child.Sandbox.Writable, cwd) {
		t.Fatalf("the child in the subdirectory: parent %q, sandbox %+v; want sandboxed, writing %s and not %s", child.Parent, child.Sandbox, sub, cwd)
	}
	fake.Script(bash("echo mine > f && echo wrote-own; echo up > ../from-child 2>/dev/null || echo no-write-up"), fakemodel.Reply{Text: "Wrote."})
	if out := must("run", child.ID, "Write."); out != "Wrote." {
		t.Fatalf("the child's run: %q", out)
	}
	if out := onlyToolResult(t, fake); !strings.Contains(out, "wrote-own") || !strings.Contains(out, "no-write-up") {
		t.Errorf("the child's writes: %s", out)
	}
	if _, err := os.Stat(filepath.Join(sub, "f")); err != nil {
		t.Errorf("the child did not write its own directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cwd, "from-child")); err == nil {
		t.Errorf("the child wrote its parent's directory")
	}
}
