package node_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/proctest"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/schemas"
)

// bash is a Bash tool call.
func bash(cmd string) fakemodel.Reply {
	in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
	return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}
}

// The real claude CLI under bypass, sandboxed: its Bash tool cannot write
// outside the agent's directory nor read a secret there, not through a
// symlink in the directory either, nor read the node's environment, nor
// write the CLI's settings; the Write tool writes inside it; a
// daemon a tool forks is as confined and ends with the agent; the turn
// ends normally. The record and the life's first status say what the
// agent was confined to.
func TestRealClaudeSandboxed(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, outside, home := t.TempDir(), t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("the decoy secret"), 0o644)
	os.Symlink(outside, filepath.Join(cwd, "link"))
	// The user's own claude settings, which every later claude reads.
	userSettings := filepath.Join(home, ".claude", "settings.json")
	os.MkdirAll(filepath.Dir(userSettings), 0o700)
	os.WriteFile(userSettings, []byte(`{"theme":"dark"}`), 0o600)
	os.MkdirAll(filepath.Join(home, ".claude", "projects", "other"), 0o700)
	os.WriteFile(filepath.Join(home, ".claude", "projects", "other", "s.jsonl"), []byte(`{"decoy":"another session"}`), 0o600)
	write, _ := json.Marshal(map[string]string{"file_path": filepath.Join(cwd, "ok.txt"), "content": "written inside"})
	fake.Script(
		bash("echo x > "+filepath.Join(outside, "f")),
		bash("cat "+secret),
		bash("cat "+filepath.Join(cwd, "link", "secret")),
		bash(fmt.Sprintf("tr '\\0' '\\n' < /proc/%d/environ", os.Getpid())), // the node's environment
		// another session's transcript, and code for every later claude
		bash("cat "+filepath.Join(home, ".claude", "projects", "other", "s.jsonl")+"; echo '{\"hooks\":{}}' > "+filepath.Join(home, ".claude", "settings.json")),
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Write", Input: write}}},
		bash("setsid sh -c 'sleep 1; echo y > "+filepath.Join(outside, "daemon")+"; exec sleep 611' > /dev/null 2>&1 < /dev/null & echo forked"),
		fakemodel.Reply{Text: "Tried everything."},
	)
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second}})
	yes := true
	id := f.open(schemas.OpenRequest{Permission: "bypass", Sandbox: &yes, CWD: cwd})
	rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Escape."})
	if err != nil || rep.Text != "Tried everything." || rep.StopReason != schemas.StopEndTurn {
		t.Fatalf("the turn: %+v %v", rep, err)
	}
	reqs := fake.Requests()
	if len(reqs) != 8 {
		t.Fatalf("the model was asked %d times", len(reqs))
	}
	result := func(i int) fakemodel.ToolResult {
		t.Helper()
		if len(reqs[i].ToolResults) != 1 {
			t.Fatalf("request %d has %d tool results", i, len(reqs[i].ToolResults))
		}
		return reqs[i].ToolResults[0]
	}
	for i, what := range map[int]string{1: "the write outside", 2: "the read of the secret", 3: "the read through the symlink", 4: "the node's environment", 5: "the CLI's settings"} {
		// Refused by Landlock, or not there at all in namespaces of its own.
		if r := result(i); !r.IsError || !refused(r.Content) || strings.Contains(r.Content, "decoy") || strings.Contains(r.Content, "PATH=") {
			t.Errorf("%s: %+v", what, r)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); !os.IsNotExist(err) {
		t.Errorf("the file outside exists: %v", err)
	}
	if b, _ := os.ReadFile(userSettings); string(b) != `{"theme":"dark"}` {
		t.Errorf("the user's claude settings are now %q", b)
	}
	if r := result(6); r.IsError {
		t.Errorf("the write inside: %+v", r)
	}
	if b, err := os.ReadFile(filepath.Join(cwd, "ok.txt")); err != nil || string(b) != "written inside" {
		t.Errorf("ok.txt: %q %v", b, err)
	}
	if r := result(7); r.IsError || !strings.Contains(r.Content, "forked") {
		t.Errorf("the daemon: %+v", r)
	}
	daemon := 0
	poll.Until(t, 10*time.Second, "the daemon runs", func() bool {
		daemon = proctest.Sleep("611")
		return daemon > 0
	})
	if _, err := os.Stat(filepath.Join(outside, "daemon")); !os.IsNotExist(err) {
		t.Errorf("the daemon wrote outside: %v", err)
	}

	rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
	if err != nil || rec.Sandbox == nil || !strings.Contains(rec.Sandbox.Kernel, "landlock ABI ") || !contains(rec.Sandbox.Writable, cwd) || rec.Sandbox.Proxy == "" {
		t.Fatalf("the record's sandbox: %s %v", mustJSON(rec.Sandbox), err)
	}
	var first *schemas.Event
	f.fabric.Replay(f.ctx(10*time.Second), []string{id}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		if ev, err := r.Event(); err == nil && first == nil {
			first = &ev
		}
		return nil
	})
	if st, ok := first.Payload.(schemas.Status); first == nil || !ok || st.Status != schemas.StatusIdle || st.Sandbox == nil || st.Sandbox.Kernel != rec.Sandbox.Kernel {
		t.Errorf("the first status: %+v", first)
	}

	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	poll.Until(t, 10*time.Second, "the daemon ends with the agent", func() bool { return proctest.Sleep("611") == 0 })
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// The same escapes through the shells of ACP agents, sandboxed under the
// default preset: opencode's bash and gemini's run_shell_command cannot
// write outside the agent's directory or read the secret there, directly
// or through a symlink in the directory, nor change the user's settings
// for the CLI; the turn ends normally.
func TestRealACPAgentsSandboxed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		agent, tool string
		command     func(t *testing.T) []string
		env         func(t *testing.T, home string, fake *fakemodel.Server) []string
	}{
		{acp.AgentOpencode, "bash", func(t *testing.T) []string { return append(peers.Opencode.Command(t), "acp") },
			func(t *testing.T, home string, fake *fakemodel.Server) []string {
				return peers.OpencodeEnv(t, home, fake.URL()+"/v1")
			}},
		{acp.AgentGemini, "run_shell_command", func(t *testing.T) []string { return append(peers.Gemini.Command(t), "--acp") },
			func(t *testing.T, home string, fake *fakemodel.Server) []string {
				return peers.GeminiEnv(t, home, fake.URL())
			}},
	} {
		t.Run(c.agent, func(t *testing.T) {
			t.Parallel()
			fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
			cwd, outside, home := t.TempDir(), t.TempDir(), t.TempDir()
			env := c.env(t, home, fake)
			// The CLIs' own settings, which name commands and servers to
			// start: a sandboxed agent must not change them for the next.
			settings := []string{filepath.Join(home, ".gemini", "settings.json"), filepath.Join(home, ".config", "opencode", "opencode.json")}
			before := map[string]string{}
			for _, p := range settings {
				b, _ := os.ReadFile(p)
				before[p] = string(b)
			}
			secret := filepath.Join(outside, "secret")
			os.WriteFile(secret, []byte("the decoy secret"), 0o644)
			os.Symlink(outside, filepath.Join(cwd, "link"))
			shell := func(cmd string) fakemodel.Reply {
				in, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
				return fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: c.tool, Input: in}}}
			}
			// The commands are scripts in the agent's directory, so the
			// agent's own permission checks (which look at the paths a
			// command names) let them run: what stops them is the kernel.
			for name, body := range map[string]string{
				"w.sh":  "echo x > " + filepath.Join(outside, "f"),
				"r.sh":  "cat " + secret,
				"l.sh":  "cat " + filepath.Join(cwd, "link", "secret"),
				"ok.sh": "echo inside > " + filepath.Join(cwd, "ok.txt"),
				"s.sh":  "echo '{}' > " + settings[0] + "; echo '{}' > " + settings[1],
			} {
				os.WriteFile(filepath.Join(cwd, name), []byte(body+"\n"), 0o755)
			}
			fake.Script(shell("sh w.sh"), shell("sh r.sh"), shell("sh l.sh"), shell("sh s.sh"), shell("sh ok.sh"), fakemodel.Reply{Text: "Tried."})
			be := acp.New(acp.Config{Commands: map[string][]string{c.agent: c.command(t)}, Env: env, StopWait: time.Second})
			f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(cfg *node.Config) { cfg.Backends = append(cfg.Backends, be) }})
			yes := true
			opened, err := f.fabric.Open(f.ctx(3*time.Minute), schemas.OpenRequest{Model: "acp:" + c.agent, Sandbox: &yes, CWD: cwd, Node: "n1"})
			if err != nil {
				logs, _ := filepath.Glob(filepath.Join(f.dir, "*.log"))
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					t.Logf("%s:\n%s", l, b)
				}
				t.Fatalf("open: %v", err)
			}
			id := opened.AgentID
			rep, err := f.fabric.Run(f.ctx(3*time.Minute), schemas.RunRequest{AgentID: id, Text: "Escape."})
			if err != nil || rep.Text != "Tried." {
				logs, _ := filepath.Glob(filepath.Join(f.dir, "*.log"))
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					t.Logf("%s:\n%s", l, b)
				}
				t.Fatalf("the turn: %+v %v\nthe model was asked: %s", rep, err, mustJSON(fake.Requests()))
			}
			if _, err := os.Stat(filepath.Join(outside, "f")); !os.IsNotExist(err) {
				t.Errorf("the file outside exists: %v", err)
			}
			for _, q := range fake.Requests() {
				for _, r := range q.ToolResults {
					if strings.Contains(r.Content, "decoy") {
						t.Errorf("a tool read the secret: %+v", r)
					}
				}
			}
			for _, p := range settings {
				if b, _ := os.ReadFile(p); string(b) != before[p] {
					t.Errorf("%s changed: %q", p, b)
				}
			}
			if b, err := os.ReadFile(filepath.Join(cwd, "ok.txt")); err != nil || strings.TrimSpace(string(b)) != "inside" {
				t.Errorf("the write inside: %q %v; the tools answered %s", b, err, mustJSON(fake.Requests()))
			}
		})
	}
}

// A node that cannot sandbox refuses a sandboxed open with one line naming
// what it lacks, whether the open comes through placement or straight to
// it, and placement sends sandboxed opens to a node that can. A node with
// --sandbox=required refuses an open that declines the sandbox, and runs
// the rest confined.
func TestSandboxRefusalAndPlacement(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	plain := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(cfg *node.Config) { cfg.Reaper = "" }})
	startNode(t, fixtureOptions{claude: fakeCLI("echo"), broker: plain.b, node: func(cfg *node.Config) {
		cfg.Name, cfg.Sandbox = "n2", schemas.SandboxRequired
	}})
	const lacks = "cannot sandbox agents: the node has no shoal binary to confine agents with"
	_, err := plain.fabric.Open(plain.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Node: "n1", Sandbox: &yes})
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "node n1 cannot take this agent: "+lacks) {
		t.Fatalf("a sandboxed open on n1 through placement: %v", err)
	}
	var rep schemas.OpenReply
	err = plain.ask(schemas.VerbOpen, schemas.OpenRequest{CWD: t.TempDir(), Node: "n1", Sandbox: &yes}, &rep)
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "node n1 "+lacks) {
		t.Fatalf("a sandboxed open straight to n1: %v", err)
	}
	if l := nodeList(t, plain); len(l) != 0 {
		t.Fatalf("n1 keeps agents after refusing: %+v", l)
	}
	_, err = plain.fabric.Open(plain.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Node: "n2", Sandbox: &no})
	if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "runs every agent sandboxed") {
		t.Fatalf("an unsandboxed open on n2: %v", err)
	}
	// Placement: the sandboxed opens go to n2 while n1 is idle and n2
	// grows busier; the one that declines goes to n1.
	for range 3 {
		op, err := plain.fabric.Open(plain.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Sandbox: &yes})
		if err != nil || op.Node != "n2" {
			t.Fatalf("a sandboxed open placed on %q: %v", op.Node, err)
		}
		rec, err := plain.fabric.Status(plain.ctx(time.Minute), op.AgentID)
		if err != nil || rec.Sandbox == nil || rec.Sandbox.Kernel == "" {
			t.Fatalf("the sandboxed agent's record: %+v %v", rec, err)
		}
	}
	op, err := plain.fabric.Open(plain.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Sandbox: &no})
	if err != nil || op.Node != "n1" {
		t.Fatalf("an open declining the sandbox placed on %q: %v", op.Node, err)
	}
	// An open that does not say runs confined on n2 (its mode) and
	// unconfined on n1.
	for _, n := range []string{"n1", "n2"} {
		op, err := plain.fabric.Open(plain.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Node: n})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := plain.fabric.Status(plain.ctx(time.Minute), op.AgentID)
		if (rec.Sandbox != nil) != (n == "n2") {
			t.Errorf("an open on %s that does not say: sandbox %+v", n, rec.Sandbox)
		}
	}
}

// refused reports whether a tool's output says the sandbox refused it:
// Landlock's "permission denied", or, in namespaces of the agent's own,
// "no such file or directory" for what is not there.
func refused(out string) bool {
	out = strings.ToLower(out)
	return strings.Contains(out, "permission denied") || strings.Contains(out, "no such file or directory")
}

// A sandboxed agent plants a symlink (to a file outside the sandbox) in
// its own config directory, where its node copies the user's settings
// each life; reopened, the node replaces the link and writes nothing
// through it.
func TestPlantedSymlinkSurvivesAReopen(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, outside, home := t.TempDir(), t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("untouched"), 0o644)
	os.MkdirAll(filepath.Join(home, ".claude"), 0o700)
	os.WriteFile(filepath.Join(home, ".claude", "settings.json"), []byte(`{"theme":"dark"}`), 0o600)
	fake.Script(bash(`ln -sf `+victim+` "$CLAUDE_CONFIG_DIR/settings.json" && ls -l "$CLAUDE_CONFIG_DIR/settings.json"`), fakemodel.Reply{Text: "Planted."},
		fakemodel.Reply{Text: "Back."})
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second}})
	yes := true
	id := f.open(schemas.OpenRequest{ID: "planter", Permission: "bypass", Sandbox: &yes, CWD: cwd})
	if rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Plant."}); err != nil || rep.Text != "Planted." {
		t.Fatalf("the turn: %+v %v", rep, err)
	}
	if r := fake.Requests()[1].ToolResults; len(r) != 1 || !strings.Contains(r[0].Content, "-> "+victim) {
		t.Fatalf("the plant: %+v", r)
	}
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	f.open(schemas.OpenRequest{ID: "planter", Permission: "bypass", Sandbox: &yes, CWD: cwd})
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Fatalf("the file outside now holds %q", b)
	}
	if rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Again."}); err != nil || rep.Text != "Back." {
		t.Fatalf("the reopened agent's turn: %+v %v", rep, err)
	}
}

// A sandboxed agent may not work where it could rewrite what its node
// runs or reads as itself: the node's files, its binary, the CLI's
// install, an MCP configuration the node reads at each life. An outside
// review found a sandboxed agent working in a checkout of shoal, from
// which the node ran, could replace the binary the node starts every
// sandbox with.
func TestSandboxedAgentMayNotWriteWhatItsNodeRuns(t *testing.T) {
	t.Parallel()
	yes := true
	home := t.TempDir()
	exe, _ := filepath.EvalSymlinks(os.Args[0])
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), dir: filepath.Join(home, "node")})
	cfg := filepath.Join(home, "work", "mcp.json")
	os.MkdirAll(filepath.Dir(cfg), 0o755)
	os.WriteFile(cfg, []byte(`{"mcpServers":{}}`), 0o644)
	// A link in its directory to a configuration outside is its to point
	// elsewhere before its next life.
	outside := filepath.Join(t.TempDir(), "mcp.json")
	os.WriteFile(outside, []byte(`{"mcpServers":{}}`), 0o644)
	linked := filepath.Join(home, "work", "linked.json")
	os.Symlink(outside, linked)
	for _, c := range []struct{ cwd, mcp, want string }{
		{home, "", "the node's files"},
		{filepath.Dir(exe), "", filepath.Dir(exe)},
		{filepath.Join(home, "work"), cfg, "its MCP configuration"},
		{filepath.Join(home, "work"), linked, "its MCP configuration"},
	} {
		_, err := f.fabric.Open(f.ctx(time.Minute), schemas.OpenRequest{CWD: c.cwd, MCPConfig: c.mcp, Node: "n1", Sandbox: &yes})
		if schemas.CodeOf(err) != schemas.CodeForbidden || !strings.Contains(err.Error(), "a sandboxed agent may not work in") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a sandboxed open in %s: %v; want a refusal naming %s", c.cwd, err, c.want)
		}
	}
	if _, err := f.fabric.Open(f.ctx(time.Minute), schemas.OpenRequest{CWD: filepath.Join(home, "work"), Node: "n1", Sandbox: &yes}); err != nil {
		t.Errorf("a sandboxed open in a directory of its own: %v", err)
	}
	// What only the agent's own processes read in its directory (a local
	// agent's stdio server works there) is no reason to refuse it.
	fake := fakemodel.Start(t, fakemodel.Config{})
	lb, err := local.New(local.Config{Kind: backend.BackendOllama, Host: fake.URL()})
	if err != nil {
		t.Fatal(err)
	}
	g := startNode(t, fixtureOptions{claude: fakeCLI("echo"), broker: f.b, node: func(cfg *node.Config) {
		cfg.Name, cfg.Backends = "n2", append(cfg.Backends, lb)
	}})
	stdio := filepath.Join(t.TempDir(), "stdio.json")
	os.WriteFile(stdio, []byte(`{"mcpServers":{"s":{"command":"/bin/cat"}}}`), 0o644)
	// (cat is no MCP server: the open fails at its handshake, past the
	// check this is about.)
	if _, err := g.fabric.Open(g.ctx(time.Minute), schemas.OpenRequest{CWD: t.TempDir(), Model: "ollama:fake-model", MCPConfig: stdio, Node: "n2", Sandbox: &yes}); err == nil || strings.Contains(err.Error(), "may not work in") || !strings.Contains(err.Error(), `MCP server "s"`) {
		t.Errorf("a sandboxed local agent with a stdio server in its directory: %v", err)
	}
	if l := nodeList(t, f); len(l) != 1 {
		t.Errorf("the node keeps %d agents; want the one opened", len(l))
	}
}

// A sandbox lets its agent read the CLI's install whole, and every
// system directory: a CLI installed next to what the node keeps from
// agents (its files, with every agent's MCP token; its credentials; the
// coordinator's signing keys) would give the agent them. An outside
// review read a node's credentials and the coordinator's keys from inside
// a sandboxed agent whose CLI was a script in the directory holding them.
// Such a sandbox is refused, naming what it would read.
func TestSandboxedAgentMayNotReadWhatItsNodeKeepsFromAgents(t *testing.T) {
	t.Parallel()
	yes := true
	exe, _ := filepath.EvalSymlinks(os.Args[0])
	script := func(dir string) claude.Config {
		t.Helper()
		p := filepath.Join(dir, "claude.sh")
		if err := os.WriteFile(p, []byte("#!/bin/sh\nexec '"+exe+"' \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		c := fakeCLI("echo")
		c.Path = p
		return c
	}
	b := natstest.Start(t)
	for i, c := range []struct {
		name       string
		cli        func(root string) claude.Config
		dir        func(root string) string
		unreadable func(root string) []string
		want       string // "" for an open that is not refused for it
		cwd        string // under root, for a case that names it
	}{
		{"the node's credentials in the agent's directory", func(string) claude.Config { return fakeCLI("echo") }, nil, func(root string) []string {
			os.MkdirAll(filepath.Join(root, "work"), 0o755)
			os.WriteFile(filepath.Join(root, "work", "n.creds"), []byte("secret"), 0o600)
			return []string{filepath.Join(root, "work", "n.creds")}
		}, "n.creds", "work"},
		{"the node's files beside the CLI", script, func(root string) string { return filepath.Join(root, "node") }, nil, "/node", ""},
		{"the node's credentials beside the CLI", script, nil, func(root string) []string {
			os.WriteFile(filepath.Join(root, "n.creds"), []byte("secret"), 0o600)
			return []string{filepath.Join(root, "n.creds")}
		}, "n.creds", ""},
		{"the home directory holding the CLI", script, nil, func(root string) []string { return []string{root} }, root0, ""},
		{"credentials in a system directory", func(string) claude.Config { return fakeCLI("echo") }, nil, func(string) []string { return []string{"/etc/passwd"} }, "/etc/passwd", ""},
		{"a CLI installed apart", func(string) claude.Config { return fakeCLI("echo") }, nil, func(root string) []string {
			os.WriteFile(filepath.Join(root, "n.creds"), []byte("secret"), 0o600)
			return []string{filepath.Join(root, "n.creds"), root}
		}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			want := strings.ReplaceAll(c.want, root0, root)
			var dir string
			if c.dir != nil {
				dir = c.dir(root)
			}
			var unreadable []string
			if c.unreadable != nil {
				unreadable = c.unreadable(root)
			}
			f := startNode(t, fixtureOptions{claude: c.cli(root), dir: dir, broker: b, node: func(cfg *node.Config) {
				cfg.Name, cfg.Unreadable = fmt.Sprintf("s%d", i), unreadable
			}})
			cwd := t.TempDir()
			if c.cwd != "" {
				cwd = filepath.Join(root, c.cwd)
			}
			_, err := f.fabric.Open(f.ctx(time.Minute), schemas.OpenRequest{CWD: cwd, Node: fmt.Sprintf("s%d", i), Sandbox: &yes})
			switch {
			case want == "" && err != nil:
				t.Errorf("a sandboxed open of a CLI installed apart from what is kept: %v", err)
			case want != "" && (schemas.CodeOf(err) != schemas.CodeForbidden || !strings.Contains(err.Error(), "cannot sandbox this agent") || !strings.Contains(err.Error(), want)):
				t.Errorf("a sandboxed open: %v; want a refusal naming %s", err, want)
			}
		})
	}
}

// root0 stands for each case's own directory in a wanted message.
const root0 = "\x00root"

// A node whose claude CLI keeps its configuration in CLAUDE_CONFIG_DIR
// keeps its .claude.json there too: every project's MCP servers, their
// tokens, and the user's. A sandboxed agent's copy of that directory
// (settings, login) holds none of it: its Bash tool finds no .claude.json
// (nor a backup of one) in its own config directory, and the turn ends
// normally.
func TestSandboxedClaudeGetsNoCopyOfTheUsersClaudeJSON(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, home := t.TempDir(), t.TempDir()
	cfg := filepath.Join(home, "ccfg")
	os.MkdirAll(cfg, 0o700)
	userJSON := `{"mcpServers":{"shoal":{"type":"http","url":"http://127.0.0.1:1/mcp","headers":{"Authorization":"Bearer USER-MCP-TOKEN"}}},` +
		`"projects":{"/elsewhere":{"mcpServers":{"gh":{"command":"gh-mcp","env":{"GITHUB_TOKEN":"ghp_ANOTHER_PROJECTS_SECRET"}}}}}}`
	os.WriteFile(filepath.Join(cfg, ".claude.json"), []byte(userJSON), 0o600)
	os.WriteFile(filepath.Join(cfg, ".claude.json.backup"), []byte(userJSON), 0o600)
	os.WriteFile(filepath.Join(cfg, "settings.json"), []byte(`{"theme":"dark"}`), 0o600)
	fake.Script(
		bash(`ls -a "$CLAUDE_CONFIG_DIR"; cat "$CLAUDE_CONFIG_DIR"/.claude.json*; cat "$CLAUDE_CONFIG_DIR"/settings.json`),
		fakemodel.Reply{Text: "Looked."},
	)
	env := append(peers.ClaudeEnv(home, fake.URL()), "CLAUDE_CONFIG_DIR="+cfg)
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: env, StopWait: time.Second}})
	yes := true
	id := f.open(schemas.OpenRequest{Permission: "bypass", Sandbox: &yes, CWD: cwd})
	rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Look."})
	if err != nil || rep.Text != "Looked." || rep.StopReason != schemas.StopEndTurn {
		t.Fatalf("the turn: %+v %v", rep, err)
	}
	reqs := fake.Requests()
	if len(reqs) != 2 || len(reqs[1].ToolResults) != 1 {
		t.Fatalf("the model was asked %d times", len(reqs))
	}
	out := reqs[1].ToolResults[0].Content
	for _, secret := range []string{"USER-MCP-TOKEN", "ghp_ANOTHER_PROJECTS_SECRET"} {
		if strings.Contains(out, secret) {
			t.Errorf("the sandboxed agent read %s from its config directory:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, `"theme":"dark"`) {
		t.Errorf("the agent's config directory holds no copy of the user's settings:\n%s", out)
	}
}

// A reopen keeps the sandbox of the life before it unless it declines
// one in so many words: what a sandboxed agent wrote in its directory (a
// git hook, an fsmonitor its CLI's first git status runs) would otherwise
// run unconfined as soon as its next life starts, with nobody asked.
// Reopened without a word on the sandbox, its Bash tool still cannot
// write outside its directory; reopened with sandbox false, it runs
// unconfined, as asked.
func TestReopenKeepsTheSandboxUnlessDeclined(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, outside, home := t.TempDir(), t.TempDir(), t.TempDir()
	fake.Script(fakemodel.Reply{Text: "First."}, bash("echo x > "+filepath.Join(outside, "f")), fakemodel.Reply{Text: "Tried."})
	f := startNode(t, fixtureOptions{claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second}})
	yes, no := true, false
	id := f.open(schemas.OpenRequest{ID: "keeper", Permission: "bypass", Sandbox: &yes, CWD: cwd})
	if rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "One."}); err != nil || rep.Text != "First." {
		t.Fatalf("the first life's turn: %+v %v", rep, err)
	}
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	f.open(schemas.OpenRequest{ID: "keeper", Permission: "bypass", CWD: cwd})
	if rec, err := f.fabric.Status(f.ctx(10*time.Second), id); err != nil || rec.Sandbox == nil {
		t.Fatalf("the reopened life's record says no sandbox: %s %v", mustJSON(rec.Sandbox), err)
	}
	if rep, err := f.fabric.Run(f.ctx(120*time.Second), schemas.RunRequest{AgentID: id, Text: "Escape."}); err != nil || rep.Text != "Tried." {
		t.Fatalf("the reopened life's turn: %+v %v", rep, err)
	}
	if r := fake.Requests()[2].ToolResults; len(r) != 1 || !r[0].IsError || !refused(r[0].Content) {
		t.Errorf("the reopened agent's write outside: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); !os.IsNotExist(err) {
		t.Errorf("the reopened agent wrote outside its directory: %v", err)
	}
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	f.open(schemas.OpenRequest{ID: "keeper", Permission: "bypass", Sandbox: &no, CWD: cwd})
	if rec, err := f.fabric.Status(f.ctx(10*time.Second), id); err != nil || rec.Sandbox != nil {
		t.Fatalf("a reopen that declined the sandbox is sandboxed: %s %v", mustJSON(rec.Sandbox), err)
	}
}

// The same once the node has forgotten the last life's record (it keeps
// a few dead agents' records, MaxDead): the stream still says the life
// was sandboxed, and the reopen is sandboxed again. An outside reader of
// the change found it reopened unconfined.
func TestReopenKeepsTheSandboxOfAForgottenLife(t *testing.T) {
	t.Parallel()
	argv := peers.Claude.Command(t)
	fake := fakemodel.Start(t, fakemodel.Config{})
	cwd, home := t.TempDir(), t.TempDir()
	f := startNode(t, fixtureOptions{
		claude: claude.Config{Path: argv[0], Env: peers.ClaudeEnv(home, fake.URL()), StopWait: time.Second},
		node:   func(c *node.Config) { c.MaxDead = 1 },
	})
	yes := true
	id := f.open(schemas.OpenRequest{ID: "keeper", Permission: "bypass", Sandbox: &yes, CWD: cwd})
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id})
	time.Sleep(1100 * time.Millisecond) // a later last_activity for the other
	other := f.open(schemas.OpenRequest{ID: "other", Permission: "bypass"})
	f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: other})
	poll.Until(t, 30*time.Second, "the node forgets keeper's record", func() bool {
		recs, _ := f.fabric.List(f.ctx(5 * time.Second))
		return !slices.ContainsFunc(recs, func(r schemas.AgentRecord) bool { return r.ID == "keeper" })
	})
	f.open(schemas.OpenRequest{ID: "keeper", Permission: "bypass", CWD: cwd})
	if rec, err := f.fabric.Status(f.ctx(10*time.Second), "keeper"); err != nil || rec.Sandbox == nil {
		t.Errorf("keeper, sandboxed in its last life, reopened without a word on the sandbox once its record was forgotten, runs unsandboxed (sandbox %v, err %v)", rec.Sandbox, err)
	}
}
