package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/schemas"
)

// A sandboxed claude agent with sandbox_net, through the whole fabric: a
// direct connect to a loopback port not on its list fails and reaches
// nothing; a request through its proxy to a host not on the list is
// refused, over CONNECT and in absolute form; a host on the list answers
// through the proxy; the model and Shoal's MCP endpoint work.
func TestSandboxNet(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{})
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

	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: %s", args, errOut)
		}
		return strings.TrimSpace(out)
	}
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
	fake := fakemodel.Start(t, fakemodel.Config{})
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude"), fake.URL()), "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	endpoint := strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint ")
	up.waitLine("shoal: ready")
	client := []string{"SHOAL_NATS=" + url}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), client, args...)
		if code != 0 {
			t.Fatalf("shoal %v: %s", args, errOut)
		}
		return strings.TrimSpace(out)
	}
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
	reqs := fake.Requests()
	got := reqs[len(reqs)-1].ToolResults
	if len(got) != 1 {
		t.Fatalf("tool results: %+v", got)
	}
	out := got[0].Content
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
