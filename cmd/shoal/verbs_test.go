package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal up runs a local node; the verbs drive a real claude agent on it
// from another process, and shoal tail shows what it did.
func TestVerbsDriveRealClaude(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	fake.Script(
		fakemodel.Reply{Text: "Running it.", ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"echo from-the-cli","description":"marker"}`)}}},
		fakemodel.Reply{Text: "It printed from-the-cli."},
		fakemodel.Reply{Text: "Second reply."},
	)
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "claude-home"), fake.URL()),
		"XDG_DATA_HOME="+dir+"/data", "XDG_CACHE_HOME="+dir+"/cache", "XDG_CONFIG_HOME="+dir+"/config")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--claude", argv[0], "--node-name", "cli-node")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	up.waitLine("shoal: node cli-node ready")
	nats := []string{"SHOAL_NATS=" + url}
	shoal := func(args ...string) (int, string, string) {
		return runShoal(t, t.TempDir(), nats, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := shoal(args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d\n%s%s\nshoal up said:\n%s", args, code, out, errOut, up.stderrText())
		}
		return strings.TrimSpace(out)
	}

	work := t.TempDir()
	id := must("open", "--id", "cli-agent", work)
	if id != "cli-agent" {
		t.Fatalf("open printed %q", id)
	}
	if got := must("run", id, "Run", "a", "command."); got != "Running it.\nIt printed from-the-cli." {
		t.Fatalf("run printed %q", got)
	}
	if got := must("send", id, "Again."); got != "2" {
		t.Fatalf("send printed %q", got)
	}
	var rec schemas.AgentRecord
	deadline := time.Now().Add(60 * time.Second)
	for rec.Turn != 2 || rec.Status != schemas.StatusIdle {
		if time.Now().After(deadline) {
			t.Fatalf("the second turn never ended: %+v", rec)
		}
		status := must("status", id)
		schematest.Control(t, "agent_record", []byte(status))
		if err := json.Unmarshal([]byte(status), &rec); err != nil {
			t.Fatal(err)
		}
	}
	if rec.Node != "cli-node" || rec.CWD != work || rec.Usage.InputTokens == 0 {
		t.Errorf("status %+v", rec)
	}
	if got := must("output", id); got != "Second reply." {
		t.Errorf("output printed %q", got)
	}
	if got := must("output", "--turn", "1", "--which", "full_turn", "--tools", id); !strings.Contains(got, "→ tool: Bash (execute)") || !strings.Contains(got, "It printed from-the-cli.") {
		t.Errorf("full turn 1:\n%s", got)
	}
	if ls := must("ls"); !strings.Contains(ls, "cli-agent") || !strings.Contains(ls, "cli-node") || !strings.Contains(ls, "idle") {
		t.Errorf("ls:\n%s", ls)
	}
	schematest.Control(t, "list_reply", []byte(must("ls", "--json")))
	if got := must("interrupt", id); got != "no turn was running" {
		t.Errorf("interrupt printed %q", got)
	}
	if got := must("close", id); got != "closed" {
		t.Errorf("close printed %q", got)
	}
	// tail --no-follow replays the agent's life and stops at the end of
	// what is stored.
	tail := must("tail", "--no-follow", id)
	for _, want := range []string{"── turn 1 ──", "» Run a command.", "▶ Bash  echo from-the-cli", "↳ completed  from-the-cli",
		"It printed from-the-cli.", "── turn 1 ended: end_turn", "── turn 2 ──", "Second reply.", "■ agent closed", "■ agent dead"} {
		if !strings.Contains(tail, want) {
			t.Errorf("tail lacks %q:\n%s", want, tail)
		}
	}
	raw := must("tail", "--no-follow", "--raw", id)
	for _, line := range strings.Split(raw, "\n") {
		if err := schematest.ValidateEvent([]byte(line)); err != nil {
			t.Errorf("tail --raw printed %q: %v", line, err)
		}
	}

	// Mistakes get one line that names them.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"send", "ghost", "hi"}, exitNotFound, "shoal send: no such agent: ghost"},
		{[]string{"send", id, "hi"}, exitUnavailable, "shoal send: agent 'cli-agent' is dead"},
		{[]string{"send"}, exitUsage, "shoal send: missing the agent id"},
		{[]string{"send", "Bad!"}, exitUsage, "shoal send: agent id \"Bad!\""},
		{[]string{"open", "/does/not/exist"}, exitUsage, "shoal open: agent cwd does not exist: /does/not/exist"},
		{[]string{"open", "--permission", "yolo", work}, exitUsage, `permission must be one of default, ask, notebook, specialist, lab, auto, bypass, not "yolo"`},
		{[]string{"close", "ghost"}, exitNotFound, "shoal close: no such agent: ghost"},
		{[]string{"status", "--nats", "nats://127.0.0.1:1", "x"}, exitUnavailable, "cannot reach NATS at nats://127.0.0.1:1"},
	} {
		code, _, errOut := shoal(c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != c.code || len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("shoal %v: exit %d, stderr %q; want exit %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
	if code := up.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("shoal up exited %d", code)
	}
}
