package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// The ACP agents Shoal knows, by the name acp:<agent> gives them.
const (
	AgentOpencode = "opencode"
	AgentClaude   = "claude"
	AgentGemini   = "gemini"
)

// Agents lists them (schemas.ACPAgents, which callers check a model
// against before it reaches a node).
var Agents = schemas.ACPAgents

// DefaultCommands are the commands that run each agent, looked up on PATH.
var DefaultCommands = map[string][]string{
	AgentOpencode: {"opencode", "acp"},
	AgentClaude:   {"claude-agent-acp"},
	AgentGemini:   {"gemini", "--acp"},
}

// Config configures the ACP backend.
type Config struct {
	// Commands overrides the command of an agent (DefaultCommands).
	Commands map[string][]string
	// Env is the environment every agent starts from; the node's own when nil.
	Env []string
	// StopWait is how long each rung of the stop ladder waits; 3s when zero.
	StopWait time.Duration
	// MaxLine is the longest stdout line accepted; 64 MiB when zero.
	MaxLine int
	// HandshakeTimeout bounds initialize and session/new; 2 minutes when zero.
	HandshakeTimeout time.Duration
}

// Backend starts ACP agents.
type Backend struct {
	cfg Config

	permitsOnce sync.Once
	permits     *permits
	permitsErr  error

	mu          sync.Mutex
	serverPorts map[string]uint16 // a sandboxed opencode's own port, from SandboxNeeds to Start
}

// New returns an ACP backend.
func New(cfg Config) *Backend {
	if cfg.Env == nil {
		cfg.Env = proc.NodeEnviron()
	}
	if cfg.StopWait == 0 {
		cfg.StopWait = 3 * time.Second
	}
	if cfg.MaxLine == 0 {
		cfg.MaxLine = 64 << 20
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 2 * time.Minute
	}
	return &Backend{cfg: cfg, serverPorts: map[string]uint16{}}
}

// Kind implements backend.Backend.
func (b *Backend) Kind() string { return backend.BackendACP }

// Command is the command that runs agent.
func (b *Backend) Command(agent string) []string {
	if c, ok := b.cfg.Commands[agent]; ok && len(c) > 0 {
		return c
	}
	return DefaultCommands[agent]
}

// Available reports which agents this machine can run, with the path of
// each one's command.
func (b *Backend) Available() map[string]string {
	out := map[string]string{}
	for _, a := range Agents {
		if p, err := exec.LookPath(b.Command(a)[0]); err == nil {
			out[a] = p
		}
	}
	return out
}

// DescribeAll implements backend.ManyDescriber: each agent this machine
// has, ready.
func (b *Backend) DescribeAll(context.Context) []schemas.BackendInfo {
	var out []schemas.BackendInfo
	avail := b.Available()
	for _, a := range Agents {
		if p, ok := avail[a]; ok {
			out = append(out, schemas.BackendInfo{Kind: backend.BackendACP, Agent: a, Path: p, Ready: true})
		}
	}
	return out
}

// SplitModel separates acp:<agent>[:<model>]'s agent from its model, the
// prefix already removed.
func SplitModel(s string) (agent, model string, err error) {
	return schemas.SplitACPModel(s)
}

// Start implements backend.Backend: it launches the agent, and returns
// once initialize and session/new have been answered.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Session, error) {
	agent, model, err := SplitModel(spec.Model)
	if err != nil {
		return nil, err
	}
	log := spec.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ws, err := newWorkspace(spec.CWD, spec.Beneath)
	if err != nil {
		return nil, err
	}
	env := append(append([]string(nil), b.cfg.Env...), spec.Env...)
	env = append(env, policyEnv(spec)...)
	s := &session{
		cfg: b.cfg, agent: agent, spec: spec, sink: sink, log: log, ws: ws,
		m: newMapper(), exited: make(chan struct{}),
		files: make(chan struct{}, maxFileRequests), wrote: make(chan struct{}),
	}
	if agent == AgentOpencode {
		dir, extra, err := b.opencodeConfig(s, model, env)
		if err != nil {
			s.cleanup()
			return nil, err
		}
		s.configDir, s.permits = dir, b.permits
		// OPENCODE_PURE turns every external plugin off, Shoal's too.
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "OPENCODE_PURE=") })
		env = append(env, extra...)
	}
	if agent == AgentGemini && spec.Sandbox != nil {
		env = append(env, "GEMINI_CLI_HOME="+backend.AgentHome(spec, "gemini"))
	}
	if agent == AgentClaude && spec.Sandbox != nil {
		env = append(env, "CLAUDE_CONFIG_DIR="+backend.AgentHome(spec, "claude"))
	}
	argv := b.Command(agent)
	b.mu.Lock()
	port, own := b.serverPorts[spec.AgentID]
	delete(b.serverPorts, spec.AgentID)
	b.mu.Unlock()
	if own && spec.Sandbox != nil {
		argv = append(slices.Clone(argv), "--port", strconv.Itoa(int(port)))
	}
	cli, stdout, err := proc.StartProcess(proc.ProcessSpec{
		Argv: argv, Dir: spec.CWD, Env: env, Stderr: spec.Stderr, Reaper: spec.Reaper, Sandbox: spec.Sandbox,
	})
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.proc = cli
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	pr, pw := io.Pipe()
	w := &wire{in: stdout, out: pw, log: spec.Stderr, maxLine: b.cfg.MaxLine,
		update: s.onUpdate, permission: s.onPermission, garbage: s.onGarbage}
	s.conn = acpsdk.NewConnection(s.handle, procWriter{cli, s.written}, pr)
	s.conn.SetLogger(log)
	go func() {
		w.run()
		stdout.Close()
		<-cli.Done()
		s.onExit()
	}()
	if err := s.handshake(ctx, model); err != nil {
		s.mu.Lock()
		s.closing, s.quiet = true, true
		s.mu.Unlock()
		s.stop(context.WithoutCancel(ctx))
		<-s.exited
		if last := proc.LastLine(cli.StderrTail()); last != "" {
			err = fmt.Errorf("%w (%s)", err, last)
		}
		return nil, fmt.Errorf("acp:%s: %w", agent, err)
	}
	return s, nil
}

// procWriter writes the JSON-RPC connection's output to the agent's
// stdin, calling wrote after each write that went whole.
type procWriter struct {
	p     *proc.Process
	wrote func()
}

func (w procWriter) Write(b []byte) (int, error) {
	n, err := w.p.Write(b)
	if err == nil && n == len(b) {
		w.wrote()
	}
	return n, err
}

// policyEnv tells the agent, and a plugin running in it, its policy.
func policyEnv(spec backend.Spec) []string {
	env := []string{
		"SHOAL_AGENT_PERMISSION=" + string(spec.Policy.Preset),
		"SHOAL_AGENT_DENY_TOOLS=" + strings.Join(spec.Policy.Disallowed, ","),
	}
	if len(spec.Policy.CallerAllowed) > 0 {
		env = append(env, "SHOAL_AGENT_ALLOW_TOOLS="+strings.Join(spec.Policy.CallerAllowed, ","))
	}
	if spec.SystemPrompt != "" {
		env = append(env, "SHOAL_AGENT_SYSTEM_PROMPT="+spec.SystemPrompt)
	}
	return env
}

// opencodeDir is an agent's own opencode configuration directory.
func opencodeDir(spec backend.Spec) string { return filepath.Join(spec.Dir, "acp-"+spec.AgentID) }

// geminiHome prepares a sandboxed gemini agent's own home
// (GEMINI_CLI_HOME, backend.AgentHome): the files at the top of the
// user's ~/.gemini (settings, login, ids), copied afresh each life, and
// the state the agent kept there before; not the OAuth tokens of the
// user's MCP (and A2A) servers, which gemini keeps there in plain files.
func geminiHome(spec backend.Spec, env []string) (string, error) {
	home := backend.AgentHome(spec, "gemini")
	src := proc.EnvValue(env, "GEMINI_CLI_HOME")
	if src == "" {
		src = proc.HomeDir(env)
	}
	if src != "" {
		src = filepath.Join(src, ".gemini")
	}
	dst := filepath.Join(home, ".gemini")
	if err := proc.SeedHome(dst, src, "mcp-oauth-tokens*", "a2a-oauth-tokens*"); err != nil {
		return "", err
	}
	return home, noPTYShell(dst)
}

// noPTYShell turns gemini's pseudo-terminal shell off in the settings of
// its directory dir: a sandboxed agent opens no terminal in /dev/pts
// (where a person's are), and gemini then runs commands as plain child
// processes. dir is the agent's to write: settings.json is read through
// no link it planted, and one that is not a regular file is replaced.
func noPTYShell(dir string) error {
	path := filepath.Join(dir, "settings.json")
	settings := map[string]any{}
	if b, err := proc.ReadBeneath(dir, "settings.json", 1<<20); err == nil {
		if err := json.Unmarshal(b, &settings); err != nil {
			return fmt.Errorf("gemini's settings %s: %w", path, err)
		}
	}
	tools, _ := settings["tools"].(map[string]any)
	if tools == nil {
		tools = map[string]any{}
	}
	shell, _ := tools["shell"].(map[string]any)
	if shell == nil {
		shell = map[string]any{}
	}
	shell["enableInteractiveShell"] = false
	tools["shell"], settings["tools"] = shell, tools
	b, _ := json.MarshalIndent(settings, "", "  ")
	if err := proc.WriteBeneath(dir, "settings.json", b, 0o600); err != nil {
		return fmt.Errorf("gemini's settings: %w", err)
	}
	return nil
}

// agentEnv are the variables each ACP agent reads: its model providers'
// and its own settings.
var agentEnv = map[string][]string{
	AgentOpencode: {"OPENCODE_*", "ANTHROPIC_*", "OPENAI_*", "GOOGLE_*", "GEMINI_*", "OPENROUTER_*", "AWS_*", "AZURE_*"},
	AgentClaude:   {"ANTHROPIC_*", "CLAUDE_*", "DISABLE_*", "IS_SANDBOX", "AWS_*", "CLOUD_ML_REGION", "VERTEX_*"},
	AgentGemini:   {"GEMINI_*", "GOOGLE_*"},
}

// SandboxNeeds implements backend.Confiner. Every agent reads its install
// (for a script, the interpreter's and the script's) and reaches its model
// API; each keeps its state where it always does: opencode its data,
// cache and state directories and its own config directory (with the
// node's permits endpoint, which its plugin asks), claude-agent-acp the
// claude CLI's config, gemini ~/.gemini.
func (b *Backend) SandboxNeeds(spec backend.Spec) (backend.Needs, error) {
	agent, _, err := SplitModel(spec.Model)
	if err != nil {
		return backend.Needs{}, err
	}
	env := append(append([]string(nil), b.cfg.Env...), spec.Env...)
	n := backend.Needs{Env: agentEnv[agent]}
	cmd := b.Command(agent)
	n.Readable = append(n.Readable, proc.InstallRoot(cmd[0]))
	for _, a := range cmd[1:] {
		if _, err := os.Stat(a); err == nil && filepath.IsAbs(a) {
			n.Readable = append(n.Readable, proc.InstallRoot(a)) // a script
		}
	}
	n.Runs = slices.Clone(n.Readable) // the agent's command, which every agent of this kind runs
	switch agent {
	case AgentOpencode:
		// The user's own config directory is read, not written: the
		// agent's is the one Shoal wrote for it.
		userConf := filepath.Join(proc.XDGDir(env, "XDG_CONFIG_HOME", ".config"), "opencode")
		n.Readable = append(n.Readable, userConf)
		n.Runs = append(n.Runs, userConf) // the node reads it for every opencode agent
		n.Writable = append(n.Writable, opencodeDir(spec),
			filepath.Join(proc.XDGDir(env, "XDG_DATA_HOME", ".local/share"), "opencode"),
			filepath.Join(proc.XDGDir(env, "XDG_CACHE_HOME", ".cache"), "opencode"),
			filepath.Join(proc.XDGDir(env, "XDG_STATE_HOME", ".local/state"), "opencode"))
		p, err := b.permitServer()
		if err != nil {
			return n, err
		}
		port, _ := strconv.Atoi(p.port())
		n.Ports = append(n.Ports, uint16(port))
		n.Hosts = append(n.Hosts, "127.0.0.1:"+p.port())
		// opencode serves itself over HTTP on loopback (port 4096, or the
		// next free one, by default): sandboxed, it is given its port.
		own, err := proc.FreePort()
		if err != nil {
			return n, err
		}
		n.Bind = append(n.Bind, own)
		b.mu.Lock()
		b.serverPorts[spec.AgentID] = own
		b.mu.Unlock()
		var providers map[string]struct {
			Options struct {
				BaseURL string `json:"baseURL"`
			} `json:"options"`
		}
		json.Unmarshal(userConfig(env)["provider"], &providers)
		for _, pr := range providers {
			if h := proc.URLHost(pr.Options.BaseURL); h != "" {
				n.Hosts = append(n.Hosts, h)
			}
		}
	case AgentClaude:
		// claude-agent-acp runs the claude CLI's code: a config directory
		// of the agent's own, as the claude backend gives its agents.
		dir := backend.AgentHome(spec, "claude")
		src := proc.EnvValue(env, "CLAUDE_CONFIG_DIR")
		if h := proc.HomeDir(env); src == "" && h != "" {
			src = filepath.Join(h, ".claude")
		}
		if err := proc.SeedHome(dir, src, backend.ClaudeNotSeeded...); err != nil {
			return n, err
		}
		n.Writable = append(n.Writable, dir)
		api := "api.anthropic.com"
		if h := proc.URLHost(proc.EnvValue(env, "ANTHROPIC_BASE_URL")); h != "" {
			api = h
		}
		n.Hosts = append(n.Hosts, api)
	case AgentGemini:
		// A home of its own, with a copy of the user's settings and
		// login: gemini rewrites its settings file as it starts, and a
		// settings file names MCP servers to start, so the user's own is
		// not handed to a sandboxed agent to write.
		h, err := geminiHome(spec, env)
		if err != nil {
			return n, err
		}
		n.Writable = append(n.Writable, h)
		api := "generativelanguage.googleapis.com"
		if h := proc.URLHost(proc.EnvValue(env, "GOOGLE_GEMINI_BASE_URL")); h != "" {
			api = h
		}
		n.Hosts = append(n.Hosts, api)
	}
	return n, nil
}

// opencodeConfig writes opencode's per-agent configuration directory: the
// user's provider block, the model, and Shoal's plugin. It returns the
// directory and the environment that points opencode at it.
func (b *Backend) opencodeConfig(s *session, model string, env []string) (string, []string, error) {
	spec := s.spec
	br, err := b.permitServer()
	if err != nil {
		return "", nil, err
	}
	dir := opencodeDir(spec)
	os.RemoveAll(dir) // a previous life's
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("opencode's config directory: %w", err)
	}
	cfg := map[string]any{"$schema": "https://opencode.ai/config.json"}
	user := userConfig(env)
	for _, k := range []string{"provider", "model", "small_model"} {
		if v, ok := user[k]; ok {
			cfg[k] = v
		}
	}
	if model != "" {
		cfg["model"] = model
	}
	// opencode asks its client before edits and commands, so each one
	// is a durable permission event decided by the agent's preset; under
	// bypass nothing is asked.
	ask := "ask"
	if spec.Policy.Dangerous {
		ask = "allow"
	}
	cfg["permission"] = map[string]string{"edit": ask, "bash": ask}
	body, _ := json.MarshalIndent(cfg, "", "  ")
	files := map[string][]byte{
		filepath.Join("opencode", "opencode.json"):              body,
		filepath.Join("opencode", "plugin", "shoal-permits.js"): pluginJS,
		// opencode installs @opencode-ai/plugin into every config
		// directory whose lock does not name it, from the npm registry,
		// and holds a plugin's load until that ends (a minute and more
		// offline). Shoal's plugin imports nothing: the directory says the
		// package is there, so an open needs no network.
		filepath.Join("opencode", "package-lock.json"):     opencodeLock,
		filepath.Join("opencode", "node_modules", ".keep"): nil,
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	for name, b := range files {
		if err := proc.WriteBeneath(dir, name, b, 0o600); err != nil {
			os.RemoveAll(dir)
			return "", nil, fmt.Errorf("opencode's config: %w", err)
		}
	}
	token := br.add(spec.AgentID, s)
	// The plugin gives up on the node after a few seconds, unless a
	// person may be asked: the node then answers by the request's
	// deadline, whatever it is.
	wait := "5000"
	if s.asks() {
		wait = strconv.Itoa(int((24 * time.Hour).Milliseconds()))
	}
	return dir, []string{
		"XDG_CONFIG_HOME=" + dir,
		"SHOAL_AGENT_ID=" + spec.AgentID,
		"SHOAL_PERMITS_PORT=" + br.port(),
		"SHOAL_PERMITS_TOKEN=" + token,
		"SHOAL_PERMITS_WAIT_MS=" + wait,
	}, nil
}

// opencodeLock is the lock file that tells opencode its config directory
// has its plugin package.
var opencodeLock = []byte(`{"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}` + "\n")

// userConfig is what an agent's config carries of the user's own
// opencode.json: its providers, and its default models, without which
// opencode would fall back to its hosted default.
func userConfig(env []string) map[string]json.RawMessage {
	dir := proc.EnvValue(env, "XDG_CONFIG_HOME")
	if dir == "" {
		if home := proc.EnvValue(env, "HOME"); home != "" {
			dir = filepath.Join(home, ".config")
		}
	}
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "opencode", "opencode.json"))
	if err != nil {
		return nil
	}
	var cfg map[string]json.RawMessage
	json.Unmarshal(b, &cfg)
	return cfg
}

// permitServer starts the loopback endpoint opencode's plugin asks, once.
func (b *Backend) permitServer() (*permits, error) {
	b.permitsOnce.Do(func() { b.permits, b.permitsErr = startPermits() })
	if b.permitsErr != nil {
		return nil, fmt.Errorf("the loopback endpoint opencode's plugin asks: %w", b.permitsErr)
	}
	return b.permits, nil
}

// Close implements io.Closer: the loopback endpoint stops. The node
// closes its backends once its agents are gone.
func (b *Backend) Close() error {
	var err error
	b.permitsOnce.Do(func() {}) // no endpoint starts after this
	if b.permits != nil {
		err = b.permits.close()
	}
	return err
}

var errNotRunning = errors.New("agent process is not running")
