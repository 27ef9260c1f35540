package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The real claude CLI under --permission ask: a Bash call becomes a
// permission event and a request every surface lists, and the agent
// waits. The request outlives a coordinator restart; the agent itself
// and an observer's token may not answer it; shoal permit allow lets the
// tool run and the turn end with its result; a second answer is a
// conflict naming the first; deny ends the tool with the person's
// message; a request nobody answers is denied at its deadline, saying so.
func TestPermissionsAnsweredByPeople(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mcpAddr := ml.Addr().String()
	l.Close()
	ml.Close()
	url := "nats://127.0.0.1:" + port
	const token, observer = "coordinator-secret", "observer-secret"
	coordinator := func() *shoalProc {
		p := startShoal(t, dir, nil, "up", "--port", port, "--no-node", "--no-bus", "--mcp-listen", mcpAddr,
			"--mcp-token", token, "--mcp-observer-token", observer)
		p.waitLine("shoal: ready")
		return p
	}
	up := coordinator()
	fake := fakemodel.Start(t, fakemodel.Config{})
	nodeHome := filepath.Join(dir, "node")
	env := append(peers.ClaudeEnv(filepath.Join(nodeHome, "claude"), fake.URL()), "XDG_CACHE_HOME="+nodeHome+"/cache")
	node := startShoal(t, nodeHome, env, "node", "--nats", url, "--node-name", "remote", "--claude", peers.Claude.Command(t)[0])
	node.waitLine("shoal: node remote joined")
	client := []string{"SHOAL_NATS=" + url}
	shoal := func(args ...string) (int, string, string) {
		t.Helper()
		return runShoal(t, t.TempDir(), client, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := shoal(args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d: %s", args, code, errOut)
		}
		return strings.TrimSpace(out)
	}
	pending := func(agent string) []schemas.PermitRecord {
		t.Helper()
		var rep schemas.PendingReply
		if err := json.Unmarshal([]byte(must("pending", "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		var out []schemas.PermitRecord
		for _, r := range rep.Requests {
			if r.AgentID == agent {
				out = append(out, r)
			}
		}
		return out
	}
	waitFor := func(agent string) schemas.PermitRecord {
		t.Helper()
		var got []schemas.PermitRecord
		deadline := time.Now().Add(60 * time.Second)
		for got = pending(agent); len(got) != 1; got = pending(agent) {
			if time.Now().After(deadline) {
				_, raw, _ := shoal("tail", "--raw", "--no-follow", agent)
				t.Fatalf("no permission request of %s; its stream:\n%s\nthe node said:\n%s", agent, raw, node.stderrText())
			}
			time.Sleep(100 * time.Millisecond)
		}
		return got[0]
	}
	bash := func(cmd string) fakemodel.Reply {
		in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
		return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
	}
	mcpAs := func(tok, agent string) *mcp.ClientSession {
		t.Helper()
		hc := &http.Client{Transport: bearer(tok)}
		if agent != "" {
			hc.Transport = headers{bearer(tok), agent}
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "permit-test", Version: "1"}, nil)
		s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://" + mcpAddr + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	permitOver := func(s *mcp.ClientSession, agent, request string) string {
		t.Helper()
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_permit",
			Arguments: map[string]any{"agent_id": agent, "request_id": request, "decision": "allow"}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}

	cwd := t.TempDir()
	id := must("open", "--permission", "ask", cwd)
	touchIt := bash("touch " + filepath.Join(cwd, "allowed.txt"))
	fake.Script(bash("echo hi && echo there > /dev/null"), touchIt, fakemodel.Reply{Text: "Touched."})
	must("send", id, "Touch a file.")
	req := waitFor(id)
	if req.Tool != "Bash" || !strings.Contains(schemas.Readable(req.Input, false), `"echo hi && echo there > /dev/null"`) || req.Node != "remote" {
		t.Fatalf("the request: %+v", req)
	}
	// The input as people read it: && and > as typed, not \u0026\u0026.
	if table := must("pending"); !regexp.MustCompile(`(?m)^AGENT +REQUEST +TOOL +WAITING +INPUT\n` + id + ` +` + req.RequestID + ` +Bash +.*"echo hi && echo there > /dev/null"`).MatchString(table + "\n") {
		t.Errorf("shoal pending:\n%s", table)
	}
	if raw := must("tail", "--raw", "--no-follow", id); !strings.Contains(raw, `"kind":"permission"`) || !strings.Contains(raw, req.RequestID) {
		t.Fatalf("the stream has no permission event for %s:\n%s", req.RequestID, raw)
	}

	// The coordinator goes away and comes back: the request is still
	// there and still answerable.
	up.stop(syscall.SIGKILL)
	coordinator()
	if got := waitFor(id); got.RequestID != req.RequestID {
		t.Fatalf("after the restart: %+v", got)
	}
	// The node said it lost the fabric, and that it is back.
	poll.Until(t, 30*time.Second, "the node to say it is connected to the fabric again", func() bool {
		said := node.stderrText()
		return strings.Contains(said, "lost the fabric; connecting again") && strings.Contains(said, "connected to the fabric again")
	})

	// Neither an observer nor the agent itself may answer.
	if text := permitOver(mcpAs(observer, ""), id, req.RequestID); !strings.Contains(text, "an observer may not answer a permission request of agent "+id+": rule observer") {
		t.Errorf("an observer's agent_permit: %s", text)
	}
	var rec schemas.AgentRecord
	json.Unmarshal([]byte(must("status", "--json", id)), &rec)
	self := mcpAs(schemas.EndpointAgentToken(token, rec.Node, id, rec.RequestID), id)
	if text := permitOver(self, id, req.RequestID); !strings.Contains(text, "refused") {
		t.Errorf("the agent answering its own request: %s", text)
	}
	if len(pending(id)) != 1 {
		t.Fatal("a refused answer settled the request")
	}

	// A person allows it: the tool runs, the turn ends with its result.
	// (The node may still be reconnecting to the restarted server.)
	poll.Until(t, 30*time.Second, "the answer reaches the node", func() bool {
		// Allowed with the input changed: the tool runs what the person
		// said.
		code, _, errOut := shoal("permit", "--input", `{"command":"echo changed by a person","description":"run it"}`, id, req.RequestID, "allow")
		if code != 0 && code != exitUnavailable {
			t.Fatalf("permit: exit %d: %s", code, errOut)
		}
		return code == 0
	})
	// The echo ran; the touch that follows asks too.
	touch := waitFor(id)
	if !strings.Contains(string(touch.Input), "allowed.txt") {
		t.Fatalf("the second request: %+v", touch)
	}
	must("permit", id, touch.RequestID, "allow")
	poll.Until(t, 60*time.Second, "the turn ends", func() bool { return must("output", id) == "Touched." })
	if _, err := readFile(filepath.Join(cwd, "allowed.txt")); err != nil {
		t.Errorf("the allowed tool did not run: %v", err)
	}
	if r := fake.Requests(); !strings.Contains(mustJSONText(r[len(r)-2].ToolResults), "changed by a person") {
		t.Errorf("the allowed echo's result: %s", mustJSONText(r[len(r)-2].ToolResults))
	}
	// The human view names the request by the id shoal permit takes, and
	// shows the command that ran, as the person changed it.
	human := must("tail", "--no-follow", id)
	if !strings.Contains(human, "? permission "+req.RequestID+" allowed by cli:") || !strings.Contains(human, "? permission "+req.RequestID+" requested for ") {
		t.Errorf("the human view does not show the request and its answer by the request's id:\n%s", human)
	}
	if !regexp.MustCompile(`↳ completed +\[Bash echo changed by a person\]`).MatchString(human) {
		t.Errorf("the human view does not show the command that ran:\n%s", human)
	}
	code, _, errOut := shoal("permit", id, req.RequestID, "deny")
	if code != exitConflict || !strings.Contains(errOut, "already answered: allow by cli:") {
		t.Errorf("a second answer: exit %d, %q", code, errOut)
	}

	// A person denies one, with a message.
	fake.Script(bash("touch "+filepath.Join(cwd, "denied.txt")), fakemodel.Reply{Text: "Refused, then."})
	must("send", id, "Touch another.")
	req2 := waitFor(id)
	must("permit", "--message", "not in this directory", id, req2.RequestID, "deny")
	poll.Until(t, 60*time.Second, "the second turn ends", func() bool { return must("output", id) == "Refused, then." })
	if _, err := readFile(filepath.Join(cwd, "denied.txt")); err == nil {
		t.Error("the denied tool ran")
	}
	last := fake.Requests()
	if r := last[len(last)-1].ToolResults; len(r) != 1 || !r[0].IsError || !strings.Contains(r[0].Content, "not in this directory") {
		t.Errorf("the denied tool's result: %+v", r)
	}

	// Nobody answers: denied at the deadline, and the agent is told why.
	// (--ask on the default preset: its edits inside the directory need
	// no one, an edit elsewhere asks.)
	elsewhere := t.TempDir()
	id2 := must("open", "--ask", "--ask-timeout", "2s", t.TempDir())
	fake.Script(bash("touch "+filepath.Join(elsewhere, "never.txt")), fakemodel.Reply{Text: "Nobody came."})
	if out := must("run", id2, "Touch one more."); out != "Nobody came." {
		t.Fatalf("the unanswered turn: %q", out)
	}
	last = fake.Requests()
	if r := last[len(last)-1].ToolResults; len(r) != 1 || !r[0].IsError || !strings.Contains(r[0].Content, "nobody answered within 2s") {
		t.Errorf("the unanswered tool's result: %+v", r)
	}
	if raw := must("tail", "--raw", "--no-follow", id2); !strings.Contains(raw, `"by":"deadline"`) {
		t.Errorf("the stream does not say the deadline answered:\n%s", raw)
	}
	if _, err := readFile(filepath.Join(elsewhere, "never.txt")); err == nil {
		t.Error("the unanswered tool ran")
	}

	// A tool its allowlist names is never asked about.
	id5 := must("open", "--permission", "ask", "--allow", "Bash", t.TempDir())
	fake.Script(bash("echo listed"), fakemodel.Reply{Text: "Ran unasked."})
	if out := must("run", id5, "Echo."); out != "Ran unasked." {
		t.Fatalf("the allowlisted turn: %q", out)
	}
	if raw := must("tail", "--raw", "--no-follow", id5); strings.Contains(raw, `"kind":"permission"`) {
		t.Errorf("an allowlisted tool was asked about:\n%s", raw)
	}

	// The agent closed while it waits: denied, saying so.
	id3 := must("open", "--permission", "ask", t.TempDir())
	fake.Script(bash("touch closed.txt"), fakemodel.Reply{Text: "never"})
	must("send", id3, "Touch it.")
	waitFor(id3)
	must("close", id3)
	poll.Until(t, 30*time.Second, "the closed agent's request settles", func() bool { return len(pending(id3)) == 0 })
	if raw := must("tail", "--raw", "--no-follow", id3); !strings.Contains(raw, `"by":"closed"`) {
		t.Errorf("the closed agent's stream does not say its request was denied:\n%s", raw)
	}

	// The node killed while an agent waits, and restarted: the request
	// ends denied, in the list and on the agent's stream.
	id4 := must("open", "--permission", "ask", t.TempDir())
	fake.Script(bash("touch orphaned.txt"), fakemodel.Reply{Text: "never"})
	must("send", id4, "Touch it.")
	r4 := waitFor(id4)
	node.stop(syscall.SIGKILL)
	node = startShoal(t, nodeHome, env, "node", "--nats", url, "--node-name", "remote", "--claude", peers.Claude.Command(t)[0])
	node.waitLine("shoal: node remote joined")
	poll.Until(t, 30*time.Second, "the orphaned request settles", func() bool { return len(pending(id4)) == 0 })
	if raw := must("tail", "--raw", "--no-follow", id4); !strings.Contains(raw, "permission request "+r4.RequestID+" (Bash) was denied: node remote restarted") {
		t.Errorf("the stream does not say the request died with its node:\n%s", raw)
	}
}

// headers sends the bearer token and names the calling agent, as an
// agent's MCP config does.
type headers struct {
	tok   bearer
	agent string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(schemas.AgentIDHeader, h.agent)
	return h.tok.RoundTrip(r)
}

// permit --help does not promise an option claude requests never offer.
func TestPermitHelpPromisesOnlyWhatIsOffered(t *testing.T) {
	t.Parallel()
	_, out, _ := runShoal(t, t.TempDir(), nil, "permit", "--help")
	if strings.Contains(out, "allow_always: a claude agent") || !strings.Contains(out, "claude requests offer none") {
		t.Errorf("shoal permit --help on --option:\n%s", out)
	}
}

// More permission requests wait than one reply of the fabric service
// holds (twenty agents, sixteen each, every input 16 KiB, the most
// listed whole): shoal pending, under a client's credentials (which list through
// the fabric service), lists each agent's oldest first and says how many
// it left out, in its table and in --json. Before, the list stopped
// short and said nothing.
func TestPendingSaysHowManyItCouldNotList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	creds := map[string]string{}
	for _, c := range [][2]string{{"coordinator", "admin"}, {"client", "cli"}} {
		creds[c[0]] = filepath.Join(dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, dir, nil, "creds", c[0], c[1], "--out", creds[c[0]], "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
	}
	up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", "-1", "--no-node", "--no-bus", "--no-mcp")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: ready")
	nc, err := nats.Connect(url, nats.UserCredentials(creds["coordinator"]))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	const agents, each = 20, 16
	for a := range agents {
		for r := range each {
			rec, _ := json.Marshal(schemas.PermitRecord{AgentID: fmt.Sprintf("busy%02d", a), RequestID: fmt.Sprintf("r%02d", r), Node: "n1", Tool: "Bash",
				Input: json.RawMessage(`{"command":"` + strings.Repeat("A", schemas.MaxListedInput-len(`{"command":""}`)) + `"}`), Options: []schemas.PermissionOption{}, AskedAt: float64(time.Now().UnixNano()) / 1e9})
			if _, err := kv.Put(t.Context(), fmt.Sprintf("busy%02d.r%02d", a, r), rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	client := []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + creds["client"]}
	code, out, errOut := runShoal(t, t.TempDir(), client, "pending", "--json")
	if code != 0 {
		t.Fatalf("shoal pending --json: exit %d: %s", code, errOut)
	}
	var rep schemas.PendingReply
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Omitted == 0 || len(rep.Requests)+rep.Omitted != agents*each {
		t.Fatalf("shoal pending --json listed %d and counted %d left out; want all %d accounted for, some left out", len(rep.Requests), rep.Omitted, agents*each)
	}
	firsts := map[string]bool{}
	for _, r := range rep.Requests {
		if r.RequestID == "r00" {
			firsts[r.AgentID] = true
		}
	}
	if len(firsts) != agents {
		t.Errorf("the list holds the oldest request of %d agents of %d", len(firsts), agents)
	}
	code, out, errOut = runShoal(t, t.TempDir(), client, "pending")
	if want := fmt.Sprintf("%d more requests wait, not listed", rep.Omitted); code != 0 || !strings.Contains(out, want) {
		t.Errorf("shoal pending: exit %d, %q not in its table's end %q (%s)", code, want, out[max(0, len(out)-300):], errOut)
	}
}
