package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// DefaultMaxRounds bounds the model rounds of one turn: each round that
// ends in tool calls is followed by another with their results.
const DefaultMaxRounds = 24

// defaultSystemPrompt frames a local model when the caller gives none.
const defaultSystemPrompt = "You are a tool-using agent run by Shoal. Call the tools you are given, by their names, when they help; answer plainly when you are done."

// Config configures a local-model backend.
type Config struct {
	// Kind is backend.BackendOllama or backend.BackendVMLX.
	Kind string
	// Host is the model server's base URL (OllamaHost, VMLXHost).
	Host string
	// MaxRounds bounds a turn's rounds; DefaultMaxRounds when zero.
	MaxRounds int
}

// Backend runs agents whose model a local server serves: Ollama's
// /api/chat, or an OpenAI-compatible server such as mlx_lm.server. There
// is no agent process; the node holds the conversation and calls the
// tools.
type Backend struct {
	cfg Config
	d   dialect
}

// New returns a backend for cfg.Kind at cfg.Host.
func New(cfg Config) (*Backend, error) {
	if cfg.MaxRounds == 0 {
		cfg.MaxRounds = DefaultMaxRounds
	}
	b := &Backend{cfg: cfg}
	switch cfg.Kind {
	case backend.BackendOllama:
		b.d = newOllama(cfg.Host)
	case backend.BackendVMLX:
		b.d = newOpenAI(cfg.Host)
	default:
		return nil, fmt.Errorf("no local-model backend of kind %q (want %s or %s)", cfg.Kind, backend.BackendOllama, backend.BackendVMLX)
	}
	return b, nil
}

// Kind implements backend.Backend.
func (b *Backend) Kind() string { return b.cfg.Kind }

// Describe implements backend.Describer: the server and its models, or
// why it cannot be reached.
func (b *Backend) Describe(ctx context.Context) schemas.BackendInfo {
	info := schemas.BackendInfo{Kind: b.cfg.Kind, Host: b.cfg.Host, Models: []string{}}
	var models []string
	var err error
	if b.cfg.Kind == backend.BackendOllama {
		models, err = OllamaModels(ctx, b.cfg.Host)
	} else {
		models, err = OpenAIModels(ctx, b.cfg.Host)
	}
	if err != nil {
		info.Problem = fmt.Sprintf("the model server at %s does not answer: %v", b.cfg.Host, err)
		return info
	}
	info.Models, info.Ready = models, true
	return info
}

// Start implements backend.Backend: it connects to the MCP servers the
// agent's tools come from and holds the conversation's start.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Session, error) {
	servers, err := agentServers(spec)
	if err != nil {
		return nil, err
	}
	tb, err := openToolbox(ctx, servers, spec.Policy, launch{reaper: spec.Reaper, sandbox: spec.Sandbox, env: spec.Env})
	if err != nil {
		return nil, err
	}
	prompt := spec.SystemPrompt
	if prompt == "" {
		prompt = defaultSystemPrompt
	}
	s := &session{
		b: b, spec: spec, sink: sink, tb: tb, model: spec.Model,
		history: []message{{Role: "system", Content: prompt}},
	}
	s.ctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	return s, nil
}

// SandboxNeeds implements backend.Confiner. A local-model agent has no
// process of its own; its stdio MCP servers do, and read their installs.
// The model API is the node's to reach, not theirs.
func (b *Backend) SandboxNeeds(spec backend.Spec) (backend.Needs, error) {
	servers, err := agentServers(spec)
	if err != nil {
		return backend.Needs{}, err
	}
	var n backend.Needs
	for _, s := range servers {
		if s.Command == "" {
			continue
		}
		for _, kv := range s.Env { // what its configuration gives it
			// A name, never a pattern: a key "*" would pass the node's
			// whole environment into the sandbox.
			if name, _, _ := strings.Cut(kv, "="); name != "" && !strings.Contains(name, "*") {
				n.Env = append(n.Env, name)
			}
		}
		n.Readable = append(n.Readable, proc.InstallRoot(s.Command))
		for _, a := range s.Args {
			if _, err := os.Stat(a); err == nil && filepath.IsAbs(a) {
				n.Readable = append(n.Readable, proc.InstallRoot(a))
			}
		}
		if s.Dir != "" {
			n.Readable = append(n.Readable, s.Dir)
		}
	}
	return n, nil
}

// agentServers are the MCP servers an agent's tools come from: the
// coordinator's, when the node knows it, and those of the caller's
// mcp_config.
func agentServers(spec backend.Spec) ([]mcpServer, error) {
	var servers []mcpServer
	if spec.MCP.URL != "" {
		h := map[string]string{schemas.AgentIDHeader: spec.AgentID}
		if spec.MCP.Token != "" {
			h["Authorization"] = "Bearer " + spec.MCP.Token
		}
		servers = append(servers, mcpServer{Name: schemas.MCPServerName, URL: spec.MCP.URL, Headers: h})
	}
	if spec.MCPConfig != "" {
		b, err := backend.ReadMCPConfig(spec.MCPConfig)
		if err != nil {
			return nil, fmt.Errorf("mcp_config: %w", err)
		}
		more, err := parseMCPConfig(b)
		if err != nil {
			return nil, fmt.Errorf("mcp_config %s: %w", spec.MCPConfig, err)
		}
		for i := range more {
			if more[i].Command != "" && more[i].Dir == "" {
				more[i].Dir = spec.CWD // stdio servers work where the agent does
			}
		}
		servers = append(servers, more...)
	}
	return servers, nil
}

// session is one conversation with a local model.
type session struct {
	b    *Backend
	spec backend.Spec
	sink backend.Sink
	tb   toolbox
	ctx  context.Context // ends when the agent closes
	stop context.CancelFunc

	mu        sync.Mutex
	model     string
	history   []message
	interrupt context.CancelFunc // ends the running turn; nil when idle
	dead      bool
	running   sync.WaitGroup // the turn goroutine, while one runs
}

func (s *session) emit(p schemas.Payload) {
	s.sink.Emit(schemas.Event{Payload: p})
}

// Prompt implements backend.Session: the turn's rounds run on their own.
func (s *session) Prompt(_ context.Context, n int, text string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.dead:
		return errors.New("agent is not alive")
	case s.interrupt != nil:
		return errors.New("the agent is still running a turn")
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.interrupt = cancel
	s.history = append(s.history, message{Role: "user", Content: text})
	s.running.Add(1)
	go s.turn(ctx, n)
	return nil
}

// turn runs turn n's rounds: the model answers, its tool calls run and
// their results go back to it, until it answers without calling a tool.
func (s *session) turn(ctx context.Context, n int) {
	defer s.running.Done()
	label := s.b.cfg.Kind
	var usage schemas.Usage
	usage.CostUSD = schemas.Cost(0)
	stop, failure := schemas.StopRefusal, ""
	for round := 1; round <= s.b.cfg.MaxRounds; round++ {
		done, err := s.round(ctx, n, round, &usage)
		switch {
		case ctx.Err() != nil:
			stop = schemas.StopCancelled
		case err != nil:
			// The dialect names itself ("ollama: …", "openai: …"); the
			// agent's kind says it once.
			why := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "ollama: "), "openai: ")
			failure = fmt.Sprintf("%s: %s", label, why)
		case done:
			stop = schemas.StopEndTurn
		default:
			continue
		}
		break
	}
	if stop == schemas.StopRefusal && failure == "" {
		failure = fmt.Sprintf("%s: hit max tool rounds (%d)", label, s.b.cfg.MaxRounds)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if failure != "" {
		s.emit(schemas.Errorf("%s", failure))
	}
	s.interrupt()
	s.interrupt = nil
	r := schemas.Result{StopReason: stop, Usage: &usage}
	if usage == (schemas.Usage{CostUSD: usage.CostUSD}) {
		r.Usage = nil // the model reported nothing (a turn cut off before it did): unknown, not zero
	}
	s.emit(r)
}

// round asks the model once, streams its answer, then runs its tool
// calls. done says the model answered without calling a tool.
func (s *session) round(ctx context.Context, n, round int, usage *schemas.Usage) (done bool, err error) {
	s.mu.Lock()
	req := chatRequest{Model: s.model, Messages: append([]message(nil), s.history...), Tools: s.tb.tools()}
	s.mu.Unlock()
	var text, thinking strings.Builder
	var calls []toolCall
	err = s.b.d.chat(ctx, req, func(d delta) error {
		if d.Thinking != "" {
			thinking.WriteString(d.Thinking)
			s.emit(schemas.Thought{Delta: true, Content: schemas.Text(d.Thinking)})
		}
		if d.Text != "" {
			text.WriteString(d.Text)
			s.emit(schemas.AssistantText{Delta: true, Content: schemas.Text(d.Text)})
		}
		calls = append(calls, d.ToolCalls...)
		if d.Usage != nil {
			usage.InputTokens += d.Usage.InputTokens
			usage.OutputTokens += d.Usage.OutputTokens
			usage.CacheReadTokens += d.Usage.CacheReadTokens
			backend.Spending(s.sink, *usage)
		}
		return nil
	})
	// What streamed is repeated as the authoritative copy, even when the
	// round was cut short.
	if strings.TrimSpace(thinking.String()) != "" {
		s.emit(schemas.Thought{Content: schemas.Text(thinking.String())})
	}
	if text.Len() > 0 {
		s.emit(schemas.AssistantText{Content: schemas.Text(text.String())})
	}
	if err != nil || ctx.Err() != nil {
		return false, err
	}
	for i := range calls {
		if calls[i].ID == "" {
			calls[i].ID = fmt.Sprintf("%s-%d-%d-%d", s.b.cfg.Kind, n, round, i)
		}
		if len(calls[i].Arguments) == 0 {
			calls[i].Arguments = json.RawMessage(`{}`)
		}
	}
	s.mu.Lock()
	s.history = append(s.history, message{Role: "assistant", Content: text.String(), Thinking: thinking.String(), ToolCalls: calls})
	s.mu.Unlock()
	if len(calls) == 0 {
		return true, nil
	}
	for _, c := range calls {
		if ctx.Err() != nil {
			return false, nil
		}
		s.emit(schemas.ToolUse{Call: schemas.ToolCall{
			ToolCallID: c.ID, Title: c.Name, Kind: schemas.ToolKindForName(c.Name),
			Status: schemas.ToolInProgress, RawInput: c.Arguments,
		}})
		var res toolResult
		if v, asked := s.ask(ctx, c); asked && !v.Allow {
			res = failedResult(fmt.Sprintf("Error: tool '%s' was denied: %s", c.Name, v.Message))
		} else {
			res = s.tb.call(ctx, c.Name, c.Arguments)
		}
		status := schemas.ToolCompleted
		if res.Failed {
			status = schemas.ToolFailed
		}
		content := res.Content
		if content == nil {
			content = []schemas.ToolCallContent{schemas.ToolText(res.Text)}
		}
		s.emit(schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: c.ID, Status: &status, Content: content}})
		s.mu.Lock()
		s.history = append(s.history, message{Role: "tool", Content: res.Text, ToolName: c.Name, ToolID: c.ID})
		s.mu.Unlock()
	}
	return false, nil
}

// ask holds a tool call for a person when the agent asks (Policy.Ask)
// and its caller's allowlist does not name the tool; asked is false when
// nobody was asked.
func (s *session) ask(ctx context.Context, c toolCall) (v backend.Verdict, asked bool) {
	pol := s.spec.Policy
	if !pol.Ask || s.spec.Asker == nil {
		return backend.Verdict{}, false
	}
	name := schemas.ParseToolName(c.Name)
	if slices.ContainsFunc(pol.CallerAllowed, func(e string) bool { return schemas.MatchEntry(e, name) }) {
		return backend.Verdict{}, false
	}
	return s.spec.Asker.Ask(ctx, backend.Question{Tool: c.Name, ToolCallID: c.ID, Input: c.Arguments}), true
}

// Interrupt implements backend.Session: the running round stops, and the
// turn ends cancelled.
func (s *session) Interrupt(context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.interrupt == nil {
		return false, nil
	}
	s.interrupt()
	return true, nil
}

// SetModel implements backend.ModelSetter: the next round asks the new
// model, which may be given with its kind's prefix or as a bare tag. A
// model the server does not list is refused, as an open of it is; while
// the server does not answer the switch is taken, and the next turn says
// what the server does.
func (s *session) SetModel(ctx context.Context, model string) (string, error) {
	if kind, rest := schemas.Route(model); kind == s.b.cfg.Kind {
		model = rest
	} else if kind != backend.BackendClaude {
		return "", fmt.Errorf("this agent runs %s models; it cannot switch to %s", s.b.cfg.Kind, model)
	}
	if model == "" {
		return "", errors.New("no model given")
	}
	if info := s.b.Describe(ctx); info.Ready && !schemas.ServesModel(info.Models, model) {
		return "", fmt.Errorf("the %s server at %s does not serve model %q (it serves %s)", s.b.cfg.Kind, s.b.cfg.Host, model, served(info.Models))
	}
	s.mu.Lock()
	s.model = model
	s.mu.Unlock()
	return s.b.cfg.Kind + ":" + model, nil
}

// Info implements backend.Session: no process, no vendor session.
func (s *session) Info() backend.Info { return backend.Info{} }

// Close implements backend.Session: the running turn ends cancelled, the
// MCP sessions close, then status dead.
func (s *session) Close(context.Context) error {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return nil
	}
	s.dead = true
	s.mu.Unlock()
	s.stop()
	s.running.Wait()
	s.tb.close()
	s.emit(schemas.Status{Status: schemas.StatusDead})
	return nil
}

// served lists a server's models for an error, at most ten of them.
func served(models []string) string {
	switch {
	case len(models) == 0:
		return "none"
	case len(models) > 10:
		return strings.Join(models[:10], ", ") + fmt.Sprintf(" and %d more", len(models)-10)
	}
	return strings.Join(models, ", ")
}
