package claude

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// Config configures the claude backend. Its zero value runs `claude` from
// PATH with the node's environment.
type Config struct {
	// Path is the CLI to run; "claude" (looked up on PATH) when empty.
	Path string
	// Env is the environment every agent process starts from; the node's
	// own when nil.
	Env []string
	// NoPartialMessages turns token streaming off (no delta events).
	NoPartialMessages bool
	// StopWait is how long each rung of the stop ladder waits; 2s when zero.
	StopWait time.Duration
	// MaxLine is the longest stdout line accepted; 64 MiB when zero.
	MaxLine int
	// WriteTimeout is how long the CLI may leave a line on its stdin
	// unread before it counts as stalled; proc.DefaultWriteTimeout
	// when zero.
	WriteTimeout time.Duration
}

// Backend starts claude CLI agents.
type Backend struct{ cfg Config }

// New returns a claude backend.
func New(cfg Config) *Backend {
	if cfg.Path == "" {
		cfg.Path = "claude"
	}
	if cfg.Env == nil {
		cfg.Env = proc.NodeEnviron()
	}
	if cfg.StopWait == 0 {
		cfg.StopWait = 2 * time.Second
	}
	if cfg.MaxLine == 0 {
		cfg.MaxLine = 64 << 20
	}
	return &Backend{cfg: cfg}
}

// Kind implements backend.Backend.
func (b *Backend) Kind() string { return backend.BackendClaude }

// Path is the CLI the backend runs.
func (b *Backend) Path() string { return b.cfg.Path }

// readBuffer is the size of the buffer stdout is read through.
const readBuffer = 16 << 10

// maxParseErrors bounds the error events one turn's garbage produces.
const maxParseErrors = 50

// cliEnv are the variables the claude CLI reads: its API's (Anthropic's,
// or Bedrock's and Vertex's), its own settings and switches.
var cliEnv = []string{"ANTHROPIC_*", "CLAUDE_*", "DISABLE_*", "MCP_*", "BASH_*", "IS_SANDBOX", "API_TIMEOUT_MS",
	"MAX_THINKING_TOKENS", "MAX_MCP_OUTPUT_TOKENS", "AWS_*", "CLOUD_ML_REGION", "VERTEX_*", "USE_BUILTIN_RIPGREP"}

// SandboxNeeds implements backend.Confiner: the CLI writes its config
// directory (~/.claude), reads its install and the MCP configs it is
// given, and reaches its model API.
func (b *Backend) SandboxNeeds(spec backend.Spec) (backend.Needs, error) {
	env := append(append([]string(nil), b.cfg.Env...), spec.Env...)
	install := proc.InstallRoot(b.cfg.Path)
	n := backend.Needs{Readable: []string{install}, Runs: []string{install}, Env: cliEnv}
	dir, err := SandboxConfigDir(spec, env)
	if err != nil {
		return n, err
	}
	n.Writable = append(n.Writable, dir)
	if spec.MCPConfig != "" {
		n.Readable = append(n.Readable, callerConfigPath(spec))
	}
	if spec.MCP.URL != "" {
		n.Readable = append(n.Readable, filepath.Join(spec.Dir, spec.AgentID+"-mcp.json"))
	}
	api := "api.anthropic.com"
	if u := proc.URLHost(proc.EnvValue(env, "ANTHROPIC_BASE_URL")); u != "" {
		api = u
	}
	n.Hosts = append(n.Hosts, api)
	return n, nil
}

// Check implements backend.Checker: what Plan would refuse.
func (b *Backend) Check(spec backend.Spec) error {
	_, err := Plan(spec, false)
	return err
}

// Start implements backend.Backend: it spawns the CLI, which then waits
// for the first turn on stdin.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Session, error) {
	launch, err := Plan(spec, !b.cfg.NoPartialMessages)
	if err != nil {
		return nil, err
	}
	if launch.MCPConfigPath != "" {
		if err := os.WriteFile(launch.MCPConfigPath, launch.MCPConfig, 0o600); err != nil {
			return nil, fmt.Errorf("write the agent's MCP config: %w", err)
		}
	}
	if launch.CallerConfigPath != spec.MCPConfig {
		if err := os.WriteFile(launch.CallerConfigPath, launch.CallerConfig, 0o600); err != nil {
			return nil, fmt.Errorf("write the agent's copy of its mcp_config: %w", err)
		}
	}
	env := append(append([]string(nil), b.cfg.Env...), spec.Env...)
	if spec.Sandbox != nil {
		env = append(env, "CLAUDE_CONFIG_DIR="+backend.AgentHome(spec, "claude"))
	}
	cli, stdout, err := proc.StartProcess(proc.ProcessSpec{
		Argv:         append([]string{b.cfg.Path}, launch.Args...),
		Dir:          spec.CWD,
		Env:          env,
		Stderr:       spec.Stderr,
		WriteTimeout: b.cfg.WriteTimeout,
		Reaper:       spec.Reaper,
		Sandbox:      spec.Sandbox,
	})
	if err != nil {
		return nil, err
	}
	log := spec.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	s := &session{
		cfg:        b.cfg,
		spec:       spec,
		life:       life,
		endLife:    endLife,
		proc:       cli,
		sink:       sink,
		configDir:  ConfigDir(env),
		cwd:        spec.CWD,
		log:        log,
		readerDone: make(chan struct{}),
		writerDone: make(chan struct{}),
		replies:    replyQueue{wake: make(chan struct{}, 1)},
	}
	go s.writeReplies()
	go s.read(stdout)
	return s, nil
}

// session is one claude CLI process.
type session struct {
	cfg        Config
	proc       *proc.Process
	sink       backend.Sink
	configDir  string // the CLI's, where its transcripts are
	cwd        string
	log        *slog.Logger
	readerDone chan struct{}
	spec       backend.Spec
	// life ends with the process: a question still put to a person is
	// then denied.
	life    context.Context
	endLife context.CancelFunc
	// The answers to the CLI's permission requests are written in the
	// order they are given, by one writer the session owns; the questions
	// a person answers wait on goroutines of asks. Both end with life,
	// and the reader waits for them before it reports the session done.
	replies    replyQueue
	asks       sync.WaitGroup
	writerDone chan struct{}

	mu          sync.Mutex
	dec         Decoder
	running     bool // a turn is producing output
	interrupted bool // an interrupt was requested for the running turn
	// begunAt is how many turns the CLI had begun when the running
	// turn's line was written: a result is that turn's only once the CLI
	// has begun it, so a result it prints twice (or late) ends no turn it
	// has not yet taken up; with no turn running, a result is nobody's.
	begunAt    int
	interrupts int
	parseErrs  int
	dead       bool
	closing    bool // Close was called: the CLI is being stopped
}

func (s *session) emit(p schemas.Payload) {
	s.sink.Emit(schemas.Event{Payload: p})
}

type userLine struct {
	Type    string `json:"type"`
	Message struct {
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"message"`
}

// Prompt implements backend.Session: one user line on stdin. The node
// writes a turn only once the previous one has ended, since the CLI folds
// a line written during a tool call into the running turn.
func (s *session) Prompt(ctx context.Context, _ int, text string) error {
	var u userLine
	u.Type = "user"
	u.Message.Role = "user"
	u.Message.Content = append(u.Message.Content, struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{"text", text})
	line, err := json.Marshal(u)
	if err != nil {
		return err
	}
	s.mu.Lock()
	switch {
	case s.dead:
		s.mu.Unlock()
		return errNotRunning
	case s.running:
		s.mu.Unlock()
		return errors.New("claude is still running a turn")
	}
	s.running, s.interrupted, s.parseErrs, s.begunAt = true, false, 0, s.dec.Begun()
	s.mu.Unlock()
	if err := s.proc.WriteLine(ctx, line); err != nil {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
		return fmt.Errorf("write the turn to claude: %w", err)
	}
	return nil
}

var errNotRunning = errors.New("agent process is not running")

// Interrupt implements backend.Session with the CLI's interrupt control
// request; the turn's result then reports cancelled.
func (s *session) Interrupt(ctx context.Context) (bool, error) {
	s.mu.Lock()
	if s.dead || !s.running {
		s.mu.Unlock()
		return false, nil
	}
	s.interrupts++
	s.interrupted = true
	line := fmt.Sprintf(`{"type":"control_request","request_id":"int-%d","request":{"subtype":"interrupt"}}`, s.interrupts)
	s.mu.Unlock()
	if err := s.proc.WriteLine(ctx, []byte(line)); err != nil {
		s.mu.Lock()
		s.interrupted = false
		s.mu.Unlock()
		return false, fmt.Errorf("write the interrupt to claude: %w", err)
	}
	return true, nil
}

// Close implements backend.Session: close stdin (the CLI finishes and
// exits), then SIGINT (it interrupts and exits), then SIGTERM, then
// SIGKILL for the whole process group.
func (s *session) Close(ctx context.Context) error {
	// A turn the ladder cuts short was cancelled, whatever the CLI says.
	s.mu.Lock()
	s.interrupted, s.closing = s.running, true
	s.mu.Unlock()
	w := s.cfg.StopWait
	s.proc.Stop(ctx, []proc.Step{
		{Signal: proc.CloseStdin, Wait: w},
		{Signal: syscall.SIGINT, Wait: w},
		{Signal: syscall.SIGTERM, Wait: w},
	})
	select {
	case <-s.readerDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Info implements backend.Session.
func (s *session) Info() backend.Info {
	s.mu.Lock()
	sid := s.dec.SessionID()
	s.mu.Unlock()
	return backend.Info{
		PID:        s.proc.PID(),
		SessionID:  sid,
		Transcript: Transcript(s.configDir, s.cwd, sid),
	}
}

// read decodes stdout until EOF, then reports how the process ended.
func (s *session) read(stdout io.ReadCloser) {
	defer close(s.readerDone)
	// A small buffer: it is held for the agent's whole life, mostly idle,
	// and ReadLine gathers a longer line from several reads.
	r := bufio.NewReaderSize(stdout, readBuffer)
	var buf []byte // each line's storage: nothing keeps a line once handled
	for {
		line, tooLong, err := proc.ReadLineInto(buf, r, s.cfg.MaxLine)
		if err != nil && len(line) > 0 && line[len(line)-1] != '\n' && s.isClosing() {
			// Half a line at the end of a CLI being stopped: it was cut
			// off mid-write, and is no line to read.
			s.log.Debug("dropping the half line a stopped claude left", "bytes", len(line))
			line = line[:0]
		}
		if len(line) > 0 || tooLong > 0 {
			s.handle(line, tooLong)
		}
		if buf = line; cap(buf) > 64<<10 {
			buf = nil // a long line's storage is not held for the agent's life
		}
		if err != nil {
			break
		}
	}
	stdout.Close()
	<-s.proc.Done()
	s.exited()
	s.asks.Wait()
	<-s.writerDone
}

// replyQueue holds the control responses waiting to be written to the
// CLI, in order.
type replyQueue struct {
	mu      sync.Mutex
	pending [][]byte
	wake    chan struct{}
}

// reply queues a control response (a JSON object) for the CLI.
func (s *session) reply(v any) {
	b, _ := json.Marshal(v)
	q := &s.replies
	q.mu.Lock()
	q.pending = append(q.pending, append(b, '\n'))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// writeReplies writes the queued control responses in order until the
// session's life ends.
func (s *session) writeReplies() {
	defer close(s.writerDone)
	q := &s.replies
	for {
		select {
		case <-q.wake:
		case <-s.life.Done():
			return
		}
		q.mu.Lock()
		batch := q.pending
		q.pending = nil
		q.mu.Unlock()
		for _, b := range batch {
			if _, err := s.proc.Write(b); err != nil {
				s.log.Warn("a permission answer did not reach claude", "err", err)
			}
		}
	}
}

func (s *session) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func (s *session) handle(line []byte, tooLong int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tooLong > 0 {
		s.emit(schemas.ErrorWith(fmt.Sprintf("claude printed a %d-byte line, longer than the %d-byte limit; it was dropped", tooLong, s.cfg.MaxLine), string(line)))
		return
	}
	for _, p := range s.dec.Line(line, s.running && s.interrupted) {
		if e, ok := p.(schemas.Error); ok && isUnmapped(e) {
			s.parseErrs++
			if s.parseErrs > maxParseErrors {
				continue
			}
			if s.parseErrs == maxParseErrors {
				s.emit(p)
				p = schemas.Errorf("claude keeps printing lines Shoal cannot read; further ones in this turn are not reported")
			}
		}
		if perm, ok := p.(schemas.Permission); ok && s.spec.Asker != nil && s.spec.Policy.Ask {
			// The node publishes the request under its own id.
			suggestions := s.dec.Suggestions(perm.RequestID)
			s.asks.Go(func() { s.ask(perm, suggestions) })
			continue
		}
		if perm, ok := p.(schemas.Permission); ok {
			// Kaimon's permission event, exactly: the tool and its input
			// are for the requests a person answers.
			perm.Tool, perm.Input, perm.Options = "", nil, perm.Options[:2]
			s.dec.Suggestions(perm.RequestID)
			s.emit(perm)
			s.refuse(perm)
			continue
		}
		if _, ok := p.(schemas.Result); ok {
			if !s.running || s.dec.Begun() == s.begunAt {
				s.log.Warn("claude printed a result of no turn it was given (twice, or before it began the one written to it); dropped")
				continue
			}
			s.emit(p)
			s.running, s.interrupted = false, false
			continue
		}
		s.emit(p)
	}
	if u, changed := s.dec.TurnUsage(); changed && s.running {
		backend.Spending(s.sink, u)
	}
}

// ask puts a permission request to a person and gives the CLI the
// answer: allowed, the tool runs with its input as asked; denied, the
// message is the tool's result.
func (s *session) ask(perm schemas.Permission, suggestions json.RawMessage) {
	v := s.spec.Asker.Ask(s.life, backend.Question{
		Tool: perm.Tool, ToolCallID: perm.ToolCall.ToolCallID, Input: perm.Input, Options: perm.Options,
	})
	answer := map[string]any{"behavior": "deny", "message": v.Message}
	if v.Allow {
		input := perm.Input
		if len(v.Input) > 0 {
			input = v.Input // as the person changed it
			// The tool call as it will run, so the stream (a tail, the
			// TUI, the dashboard) shows what ran, not what was asked.
			s.emit(schemas.ToolUse{Call: toolCall(perm.ToolCall.ToolCallID, perm.Tool, input)})
		}
		if len(input) == 0 {
			input = json.RawMessage("{}")
		}
		answer = map[string]any{"behavior": "allow", "updatedInput": input}
		if v.Option == "allow_always" {
			// The CLI's own suggestion, kept to this session: nothing is
			// written to the project's settings.
			answer["updatedPermissions"] = inSession(suggestions)
		}
	}
	s.reply(map[string]any{
		"type":     "control_response",
		"response": map[string]any{"subtype": "success", "request_id": perm.RequestID, "response": answer},
	})
}

// inSession is the CLI's permission suggestions with every destination
// made the session.
func inSession(suggestions json.RawMessage) []map[string]any {
	var out []map[string]any
	json.Unmarshal(suggestions, &out)
	for _, s := range out {
		s["destination"] = "session"
	}
	return out
}

// refuse answers a permission request: Shoal starts the CLI with its
// policy in flags, so a prompt has no one to answer it, and a headless
// agent must never wait forever. s.mu is held; the write happens off it.
func (s *session) refuse(perm schemas.Permission) {
	const why = "Shoal runs this agent headless: its permissions come from its preset, and nobody is here to approve a prompt"
	s.emit(schemas.ErrorWith("refused a tool call: "+why, map[string]string{"toolCallId": perm.ToolCall.ToolCallID}))
	s.reply(map[string]any{
		"type": "control_response",
		"response": map[string]any{
			"subtype":    "success",
			"request_id": perm.RequestID,
			"response":   map[string]any{"behavior": "deny", "message": why},
		},
	})
}

func isUnmapped(e schemas.Error) bool {
	return e.Message == "stream-json parse error" || strings.HasPrefix(e.Message, "unmapped claude")
}

// exited reports the end of the process: an error unless Close asked for
// it, then status dead.
func (s *session) exited() {
	s.endLife()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	select {
	case <-s.proc.Stopping():
	default:
		msg := "claude exited: " + proc.ExitDescription(s.proc.Err())
		if last := proc.LastLine(s.proc.StderrTail()); last != "" {
			msg += ": " + last
		}
		s.emit(schemas.ErrorWith(msg, map[string]string{"stderr": s.proc.StderrTail()}))
	}
	s.emit(schemas.Status{Status: schemas.StatusDead})
}

// Describe implements backend.Describer: the CLI's path and its version.
func (b *Backend) Describe(ctx context.Context) schemas.BackendInfo {
	info := schemas.BackendInfo{Kind: backend.BackendClaude, Path: b.cfg.Path, Ready: true}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.cfg.Path, "--version")
	cmd.Env = b.cfg.Env
	out, err := cmd.Output()
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		info.Ready, info.Problem = false, "the claude CLI was not found ("+b.cfg.Path+")"
		return info
	case err != nil:
		info.Ready, info.Problem = false, "`"+b.cfg.Path+" --version` failed: "+err.Error()
		return info
	}
	info.Version = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if b.loggedOut(ctx) {
		info.Ready, info.Problem = false, "the claude CLI is not logged in (`"+b.cfg.Path+" auth status`): log in as the node's user, or give the node ANTHROPIC_API_KEY"
	}
	return info
}

// loggedOut reports whether the CLI says it is not logged in: every turn
// would end with "Not logged in". A CLI that cannot say (a version
// without `auth status`, an answer that is not its JSON) is taken at its
// word that it runs.
func (b *Backend) loggedOut(ctx context.Context) bool {
	cmd := exec.CommandContext(ctx, b.cfg.Path, "auth", "status")
	cmd.Env = b.cfg.Env
	out, _ := cmd.Output() // not logged in may exit non-zero; the JSON says
	var status struct {
		LoggedIn *bool `json:"loggedIn"`
	}
	return json.Unmarshal(out, &status) == nil && status.LoggedIn != nil && !*status.LoggedIn
}
