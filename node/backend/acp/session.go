package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// maxGarbage bounds the error events one turn's unreadable lines produce.
const maxGarbage = 50

// session is one ACP agent process and its one ACP session.
type session struct {
	cfg    Config
	agent  string
	spec   backend.Spec
	sink   backend.Sink
	log    *slog.Logger
	ws     *workspace
	proc   *proc.Process
	conn   *acpsdk.Connection
	ctx    context.Context // ends when the agent does
	cancel context.CancelFunc
	// files holds a place for each of the agent's file requests under
	// way, from its handling until a write to the agent after it went
	// through (its answer's, or one before it): a request holds what it
	// read until its answer is written, which an agent that stops reading
	// its stdin never lets happen, and the JSON-RPC connection handles
	// each request on a goroutine of its own as it comes.
	files       chan struct{}
	fileWaiting atomic.Int32 // file requests waiting for a place
	wroteMu     sync.Mutex
	wrote       chan struct{} // closed at the next write to the agent that goes through
	configDir   string
	permits     *permits
	exited      chan struct{}

	// Learnt in the handshake.
	sid        string
	claudeMeta bool // the agent takes _meta.claudeCode options

	mu          sync.Mutex
	m           *mapper
	prompts     int           // session/prompt requests made, to tell a late answer from the running one's
	active      int           // the prompt running; 0 when idle
	interrupted int           // the prompt a cancel was sent for
	draining    bool          // claude-agent-acp is replacing a session a cancel spoilt
	drained     chan struct{} // closed when draining ends
	model       string        // the model last set, "" for the agent's default
	garbage     int
	closing     bool
	quiet       bool // the agent never started: its end is not reported
	dead        bool
}

func (s *session) emit(p schemas.Payload) {
	if s.quiet {
		return
	}
	s.sink.Emit(schemas.Event{Payload: p})
}

// handshake runs initialize and session/new, then applies the model and
// the plan mode.
func (s *session) handshake(ctx context.Context, model string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	defer cancel()
	initRaw, err := acpsdk.SendRequest[json.RawMessage](s.conn, ctx, "initialize", map[string]any{
		"protocolVersion": 1,
		"clientCapabilities": map[string]any{
			"fs":       map[string]bool{"readTextFile": true, "writeTextFile": true},
			"terminal": false,
		},
		"clientInfo": map[string]string{"name": "shoal", "version": "1"},
	})
	if err != nil {
		return fmt.Errorf("initialize: %w", s.rpcError(err))
	}
	var init struct {
		AgentCapabilities struct {
			Meta struct {
				ClaudeCode json.RawMessage `json:"claudeCode"`
			} `json:"_meta"`
		} `json:"agentCapabilities"`
		AuthMethods []struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"authMethods"`
	}
	json.Unmarshal(initRaw, &init)
	cc := strings.TrimSpace(string(init.AgentCapabilities.Meta.ClaudeCode))
	s.claudeMeta = strings.HasPrefix(cc, "{")

	newRaw, err := acpsdk.SendRequest[json.RawMessage](s.conn, ctx, "session/new", s.newSessionParams())
	if err != nil {
		err = fmt.Errorf("session/new: %w", s.rpcError(err))
		if len(init.AuthMethods) > 0 {
			var ms []string
			for _, m := range init.AuthMethods {
				ms = append(ms, fmt.Sprintf("%s (%s)", m.ID, m.Name))
			}
			err = fmt.Errorf("%w; the agent offers to log in with %s, which Shoal does not do: log the agent in on this node first", err, strings.Join(ms, ", "))
		}
		return err
	}
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(newRaw, &sess) != nil || sess.SessionID == "" {
		return fmt.Errorf("session/new answered without a sessionId: %.200s", newRaw)
	}
	s.mu.Lock()
	s.sid = sess.SessionID
	s.mu.Unlock()

	if model != "" && s.agent != AgentOpencode {
		if err := s.set(ctx, "model", model); err != nil {
			s.emit(schemas.ErrorWith(fmt.Sprintf("could not select model '%s'; the agent is running its own default", model), map[string]string{"error": err.Error()}))
		} else {
			s.mu.Lock()
			s.model = model
			s.mu.Unlock()
		}
	}
	if notice := s.unenforceable(); notice != "" {
		s.emit(schemas.Errorf("%s", notice))
	}
	if s.spec.Policy.Mode == "plan" {
		if err := s.set(ctx, "mode", "plan"); err != nil {
			s.emit(schemas.ErrorWith("could not put the agent in plan mode", map[string]string{"error": err.Error()}))
		}
	}
	return nil
}

// newSessionParams are session/new's: the directory, the coordinator's
// MCP server, and the deny list as claude-agent-acp's options.
func (s *session) newSessionParams() map[string]any {
	servers := []any{}
	if mcp := s.spec.MCP; mcp.URL != "" {
		headers := []map[string]string{{"name": schemas.AgentIDHeader, "value": s.spec.AgentID}}
		if mcp.Token != "" {
			headers = append(headers, map[string]string{"name": "Authorization", "value": "Bearer " + mcp.Token})
		}
		servers = append(servers, map[string]any{"type": "http", "name": schemas.MCPServerName, "url": mcp.URL, "headers": headers})
	}
	p := map[string]any{"cwd": s.ws.root, "mcpServers": servers}
	pol := s.spec.Policy
	strict := pol.Preset == schemas.PresetNotebook || pol.Preset == schemas.PresetSpecialist
	if len(pol.Disallowed) > 0 || strict {
		opts := map[string]any{"disallowedTools": nonNil(pol.Disallowed)}
		if strict {
			opts["settingSources"] = []string{}
			opts["strictMcpConfig"] = true
		}
		p["_meta"] = map[string]any{"claudeCode": map[string]any{"options": opts}}
	}
	return p
}

func nonNil(xs []string) []string {
	if xs == nil {
		return []string{}
	}
	return xs
}

// unenforceable says when the policy names the agent's own tools but the
// agent takes neither Shoal's plugin nor claude-agent-acp's options, so
// those entries bind only where it asks permission.
func (s *session) unenforceable() string {
	if s.agent == AgentOpencode || s.claudeMeta {
		return ""
	}
	var native []string
	for _, e := range s.spec.Policy.Disallowed {
		if !strings.Contains(e, "__") && !strings.Contains(e, "/") && !slices.Contains(schemas.RecursionGuard, e) {
			native = append(native, e)
		}
	}
	var what string
	switch {
	case len(native) > 0:
		what = "the deny list (" + strings.Join(native, ", ") + ")"
	case len(s.spec.Policy.CallerAllowed) > 0:
		what = "this agent's allowlist"
	default:
		return ""
	}
	return fmt.Sprintf("acp:%s loads neither Shoal's plugin nor the _meta.claudeCode options, so %s binds its own tools only where it asks permission; use acp:opencode or acp:claude where the policy must bind every tool", s.agent, what)
}

// set sets the session's model or mode: session/set_<key>, then
// session/set_config_option with value, then with optionId. Each try has
// 15 seconds; a timeout stops the tries.
func (s *session) set(ctx context.Context, key, value string) error {
	tries := []struct {
		method string
		params map[string]any
	}{
		{"session/set_" + key, map[string]any{"sessionId": s.sid, key + "Id": value}},
		{"session/set_config_option", map[string]any{"sessionId": s.sid, "configId": key, "value": value}},
		{"session/set_config_option", map[string]any{"sessionId": s.sid, "configId": key, "optionId": value}},
	}
	var errs []string
	for _, t := range tries {
		tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := acpsdk.SendRequest[json.RawMessage](s.conn, tctx, t.method, t.params)
		cancel()
		if err == nil {
			return nil
		}
		errs = append(errs, t.method+": "+s.rpcError(err).Error())
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("could not set %s=%s: %s", key, value, strings.Join(errs, "; "))
}

// rpcError words an error from the agent for a person.
func (s *session) rpcError(err error) error {
	var re *acpsdk.RequestError
	if errors.As(err, &re) {
		if re.Data != nil {
			if b, _ := json.Marshal(re.Data); len(b) > 0 && string(b) != "null" {
				return fmt.Errorf("%s (%s)", re.Message, b)
			}
		}
		return errors.New(re.Message)
	}
	select {
	case <-s.exited:
		return fmt.Errorf("the agent exited: %s", proc.ExitDescription(s.proc.Err()))
	default:
	}
	return err
}

// Prompt implements backend.Session with a session/prompt request that
// runs, on its own, for as long as the agent takes. After an interrupt of
// claude-agent-acp it first waits, within ctx, for the fresh session that
// replaces the spoilt one.
func (s *session) Prompt(ctx context.Context, _ int, text string) error {
	s.mu.Lock()
	for s.draining && !s.dead {
		drained := s.drained
		s.mu.Unlock()
		select {
		case <-drained:
		case <-ctx.Done():
			return fmt.Errorf("acp:%s is still replacing its session after the interrupt: %w", s.agent, ctx.Err())
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	switch {
	case s.dead || s.closing:
		return errNotRunning
	case s.active != 0:
		return fmt.Errorf("acp:%s is still running a turn", s.agent)
	}
	s.prompts++
	n := s.prompts
	s.active, s.garbage = n, 0
	s.m.clearTurnText()
	go s.prompt(n, text)
	return nil
}

// prompt runs one session/prompt, for as long as the agent takes.
func (s *session) prompt(n int, text string) {
	raw, err := acpsdk.SendRequest[json.RawMessage](s.conn, s.ctx, "session/prompt", map[string]any{
		"sessionId": s.sid,
		"prompt":    []map[string]string{{"type": "text", "text": text}},
	})
	if err != nil {
		// An agent going away fails its prompt first; its exit, which
		// ends the turn and says why, follows at once.
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
		}
	}
	s.answered(n, raw, err)
}

// promptResult is session/prompt's answer.
type promptResult struct {
	StopReason string          `json:"stopReason"`
	Usage      json.RawMessage `json:"usage"`
	Meta       struct {
		Quota struct {
			TokenCount struct {
				Input  json.RawMessage `json:"input_tokens"`
				Output json.RawMessage `json:"output_tokens"`
			} `json:"token_count"`
		} `json:"quota"`
	} `json:"_meta"`
}

// answered takes the answer of prompt n.
func (s *session) answered(n int, raw json.RawMessage, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active != n {
		return // ended already: the agent exited
	}
	var r promptResult
	if err == nil {
		json.Unmarshal(raw, &r)
	}
	if err != nil {
		s.emit(schemas.Errorf("turn failed: %v", s.rpcError(err)))
		stop := schemas.StopRefusal
		select {
		case <-s.exited:
			stop = schemas.StopCancelled
		default:
			if s.ctx.Err() != nil {
				stop = schemas.StopCancelled
			}
		}
		s.end(n, stop, nil)
		return
	}
	stop := schemas.ParseStopReason(r.StopReason)
	if s.interrupted == n && stop != schemas.StopCancelled {
		// An agent may answer a cancel with the reason it would have
		// ended anyway (goose reports end_turn): the turn was cut short
		// all the same, and is reported so.
		s.log.Info("the agent answered a turn it was asked to cancel with another stop reason; reported cancelled", "turn", n, "stopReason", r.StopReason)
		stop = schemas.StopCancelled
	}
	usage := r.Usage
	if len(usage) == 0 {
		// gemini reports a turn's tokens in its result's _meta.
		if tc := r.Meta.Quota.TokenCount; len(tc.Input) > 0 || len(tc.Output) > 0 {
			usage, _ = json.Marshal(map[string]json.RawMessage{"inputTokens": tc.Input, "outputTokens": tc.Output})
		}
	}
	s.end(n, stop, s.usage(usage))
}

// end closes prompt n's turn: the streamed thought and text again as
// authoritative events, then its result. s.mu is held.
func (s *session) end(n int, stop schemas.StopReason, usage *schemas.Usage) {
	thought, text := s.m.takeTurnText()
	if strings.TrimSpace(thought) != "" {
		s.emit(schemas.Thought{Content: schemas.Text(thought)})
	}
	if strings.TrimSpace(text) != "" {
		s.emit(schemas.AssistantText{Content: schemas.Text(text)})
	}
	if stop == schemas.StopCancelled && s.agent == AgentClaude && !s.dead {
		// Set before the result goes out, so the node's next prompt
		// waits for the fresh session.
		s.draining, s.drained = true, make(chan struct{})
		go s.refresh()
	}
	s.emit(schemas.Result{StopReason: stop, Usage: usage})
	s.active = 0
	if s.interrupted == n {
		s.interrupted = 0
	}
}

// refresh works around claude-agent-acp 0.23.1 after a cancel: the
// cancelled turn's result stays inside its session, so the next prompt
// would be answered with it at once and its own output would arrive with
// the prompt after. The session is forked into a fresh one holding the
// same conversation, and the old one closed; whatever the old one still
// streams is dropped, since it names the old session. Turns sent
// meanwhile wait.
func (s *session) refresh() {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
	defer cancel()
	old := s.sid
	params := s.newSessionParams()
	params["sessionId"] = old
	raw, err := acpsdk.SendRequest[json.RawMessage](s.conn, ctx, "session/fork", params)
	var fork struct {
		SessionID string `json:"sessionId"`
	}
	if err == nil {
		json.Unmarshal(raw, &fork)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if s.draining {
			s.draining = false
			close(s.drained)
		}
		s.m.clearTurnText()
	}()
	if err != nil || fork.SessionID == "" {
		s.emit(schemas.Errorf("could not start a fresh session after the interrupt (%v); the next turn may be answered with the interrupted one's output", s.rpcError(err)))
		return
	}
	s.sid = fork.SessionID
	s.m.newSession()
	go func() {
		if _, err := acpsdk.SendRequest[json.RawMessage](s.conn, ctx, "session/close", map[string]string{"sessionId": old}); err != nil {
			s.log.Warn("closing the interrupted session failed", "session", old, "err", err)
		}
	}()
	if s.model != "" {
		go func() {
			if err := s.set(s.ctx, "model", s.model); err != nil {
				s.log.Warn("the fresh session kept its default model", "err", err)
			}
		}()
	}
}

// usage reads a prompt's usage leniently, with what the session cost
// since the turn before (usage_update reports the session's total); nil
// when there is neither. ACP's usage names the cache's reads and writes
// cachedReadTokens and cachedWriteTokens; claude-agent-acp sends both.
func (s *session) usage(raw json.RawMessage) *schemas.Usage {
	var u map[string]json.RawMessage
	json.Unmarshal(raw, &u)
	cost := s.m.takeTurnCost()
	if len(u) == 0 && cost == nil {
		return nil
	}
	return &schemas.Usage{
		InputTokens:         lenient(u["inputTokens"]),
		OutputTokens:        lenient(u["outputTokens"]) + lenient(u["thoughtTokens"]),
		CacheReadTokens:     lenient(u["cachedReadTokens"]),
		CacheCreationTokens: lenient(u["cachedWriteTokens"]),
		CostUSD:             cost,
	}
}

// lenient reads a token count: a number (floats rounded), a numeric
// string, anything else 0. A count past maxLenient is held there (a
// float's conversion would wrap it negative): out of any turn's range,
// which the node holds results to and says so.
func lenient(raw json.RawMessage) int64 {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return 0
	}
	f := math.NaN()
	switch x := v.(type) {
	case float64:
		f = x
	case string:
		f, _ = strconv.ParseFloat(strings.TrimSpace(x), 64)
	}
	switch {
	case math.IsNaN(f) || f < 0:
		return 0
	case f >= maxLenient:
		return maxLenient
	}
	return int64(math.Round(f))
}

// maxLenient bounds a count lenient reads; two of them add up without
// wrapping.
const maxLenient = math.MaxInt64 / 4

// onUpdate maps a session/update in wire order. An update of another
// session than the agent's is dropped: after a refresh, the old session
// may still be talking.
func (s *session) onUpdate(sessionID string, raw json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining || (s.sid != "" && sessionID != "" && sessionID != s.sid) {
		s.log.Debug("dropped an update of a replaced session", "session", sessionID)
		return
	}
	for _, p := range s.m.update(raw) {
		s.emit(p)
	}
	// What a running turn has cost so far, as the agent says it goes:
	// the node holds the turn to its dollar budgets with it, and counts
	// it if the agent dies before the turn's end.
	if s.active != 0 && bytes.Contains(raw, []byte(`"usage_update"`)) {
		if c := s.m.turnCost(); c != nil {
			backend.Spending(s.sink, schemas.Usage{CostUSD: c})
		}
	}
	// The mapper maps mode changes to nothing; they are only logged. The
	// rare kind is told by its name, not by reading the update again.
	if bytes.Contains(raw, []byte(`"current_mode_update"`)) {
		s.log.Info("the agent changed mode", "update", string(raw))
	}
}

// onPermission announces a permission request, in wire order, before it
// is answered.
func (s *session) onPermission(id, params json.RawMessage) {
	var p struct {
		ToolCall struct {
			ToolCallID string `json:"toolCallId"`
		} `json:"toolCall"`
		Options []schemas.PermissionOption `json:"options"`
	}
	json.Unmarshal(params, &p)
	if s.asks() && s.agent != AgentOpencode {
		return // the node publishes the request it puts to a person
	}
	reqID := strings.Trim(string(id), `"`)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.Options == nil {
		p.Options = []schemas.PermissionOption{}
	}
	s.emit(schemas.Permission{ToolCall: schemas.PermissionToolCall{ToolCallID: p.ToolCall.ToolCallID}, Options: p.Options, RequestID: reqID})
}

// onGarbage reports a stdout line that is not a JSON-RPC message.
func (s *session) onGarbage(line []byte, tooLong int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.garbage++
	switch {
	case s.garbage > maxGarbage:
		return
	case s.garbage == maxGarbage:
		s.emit(schemas.Errorf("acp:%s keeps printing lines Shoal cannot read; further ones in this turn are not reported", s.agent))
		return
	}
	if tooLong > 0 {
		s.emit(schemas.ErrorWith(fmt.Sprintf("acp:%s printed a %d-byte line, longer than the %d-byte limit; it was dropped", s.agent, tooLong, s.cfg.MaxLine), string(line)))
		return
	}
	s.emit(schemas.ErrorWith(fmt.Sprintf("acp:%s printed a line that is not JSON-RPC; it was ignored", s.agent), string(line[:min(len(line), 1<<10)])))
}

// handle answers the agent's requests.
func (s *session) handle(ctx context.Context, method string, params json.RawMessage) (any, *acpsdk.RequestError) {
	switch method {
	case "session/request_permission":
		return s.requestPermission(ctx, params), nil
	case "fs/read_text_file", "fs/write_text_file":
		if err := s.takeFile(ctx); err != nil {
			return nil, err
		}
		defer s.releaseFile()
		if method == "fs/read_text_file" {
			return s.readTextFile(params)
		}
		return s.writeTextFile(params)
	case "session/update":
		return nil, nil // the wire maps these; none reaches here
	}
	return nil, &acpsdk.RequestError{Code: -32601, Message: "unsupported client method " + method}
}

// maxFileRequests bounds an agent's file requests under way (s.files):
// each may hold a file of up to maxRead, and again as its answer. More
// wait their turn (an agent may read many files at once), at most
// maxFileWaiting of them for at most fileWait each.
const (
	maxFileRequests = 1
	maxFileWaiting  = 64
	fileWait        = 30 * time.Second
)

// takeFile takes a place for a file request, waiting for one if need be,
// or says why it may not.
func (s *session) takeFile(ctx context.Context) *acpsdk.RequestError {
	select {
	case s.files <- struct{}{}:
		return nil
	default:
	}
	busy := func(why string) *acpsdk.RequestError {
		return &acpsdk.RequestError{Code: -32000, Message: fmt.Sprintf(
			"%d file requests of this agent are under way, the most it may have (their answers wait for it to read them), and %s: ask again once one is answered", maxFileRequests, why)}
	}
	if s.fileWaiting.Add(1) > maxFileWaiting {
		s.fileWaiting.Add(-1)
		return busy(fmt.Sprintf("%d more wait", maxFileWaiting))
	}
	defer s.fileWaiting.Add(-1)
	wait := time.NewTimer(fileWait)
	defer wait.Stop()
	select {
	case s.files <- struct{}{}:
		return nil
	case <-wait.C:
		return busy(fmt.Sprintf("this one waited %s", fileWait))
	case <-ctx.Done():
		return busy("this one is given up")
	case <-s.ctx.Done():
		return busy("the agent has ended")
	}
}

// releaseFile gives a file request's place back once a write to the agent
// after it has gone through (or the agent has ended).
func (s *session) releaseFile() {
	s.wroteMu.Lock()
	next := s.wrote
	s.wroteMu.Unlock()
	go func() {
		select {
		case <-next:
		case <-s.ctx.Done():
		}
		<-s.files
	}()
}

// written is called after each write to the agent that went whole.
func (s *session) written() {
	s.wroteMu.Lock()
	close(s.wrote)
	s.wrote = make(chan struct{})
	s.wroteMu.Unlock()
}

// asks reports whether the agent puts what its policy does not settle to
// a person.
func (s *session) asks() bool { return s.spec.Policy.Ask && s.spec.Asker != nil }

// requestPermission decides a tool call by the agent's policy: the deny
// list by the call's title and kind, then every path it names must be in
// the agent's directory. What passes is allowed, or, for an agent that
// asks, put to a person with the agent's own options, unless its
// allowlist names the tool.
func (s *session) requestPermission(ctx context.Context, params json.RawMessage) any {
	var p struct {
		ToolCall struct {
			ToolCallID string          `json:"toolCallId"`
			Title      string          `json:"title"`
			Kind       string          `json:"kind"`
			RawInput   json.RawMessage `json:"rawInput"`
			Locations  []struct {
				Path string `json:"path"`
			} `json:"locations"`
			Meta struct {
				ClaudeCode struct {
					ToolName string `json:"toolName"`
				} `json:"claudeCode"`
			} `json:"_meta"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Name     string `json:"name"`
			Kind     string `json:"kind"`
		} `json:"options"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return map[string]any{"outcome": map[string]string{"outcome": "cancelled"}}
	}
	tc := p.ToolCall
	var why string
	if entry, denied := deniedAtAsk(s.spec.Policy.Disallowed, tc.Title, tc.Kind); denied {
		why = "denied by this agent's policy (" + entry + ")"
	} else if name := tc.Meta.ClaudeCode.ToolName; name != "" {
		if ok, w := decide(s.spec.Policy, name); !ok {
			why = w
		}
	}
	if why == "" {
		var locs []string
		for _, l := range tc.Locations {
			locs = append(locs, l.Path)
		}
		paths := callPaths(tc.RawInput, locs)
		if len(paths) == 0 {
			s.mu.Lock()
			paths = s.m.paths(tc.ToolCallID)
			s.mu.Unlock()
		}
		for _, path := range paths {
			if _, err := s.ws.resolve(path); err != nil {
				why = err.Error()
				break
			}
		}
	}
	pick := func(kinds ...string) any {
		for _, k := range kinds {
			for _, o := range p.Options {
				if o.Kind == k {
					return map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": o.OptionID}}
				}
			}
		}
		return map[string]any{"outcome": map[string]string{"outcome": "cancelled"}}
	}
	if why != "" {
		s.mu.Lock()
		s.emit(schemas.ErrorWith("refused a tool call: "+why, map[string]string{"toolCallId": tc.ToolCallID}))
		s.mu.Unlock()
		return pick("reject_once", "reject_always")
	}
	name := tc.Meta.ClaudeCode.ToolName
	if name == "" {
		name = tc.Title
	}
	// opencode's calls were put to a person by Shoal's plugin already,
	// before opencode asks its client about them.
	if s.asks() && s.agent != AgentOpencode && !allowlisted(s.spec.Policy, name) {
		q := backend.Question{Tool: name, ToolCallID: tc.ToolCallID, Input: tc.RawInput, Description: tc.Title}
		for _, o := range p.Options {
			q.Options = append(q.Options, schemas.PermissionOption{OptionID: o.OptionID, Name: o.Name, Kind: schemas.ParsePermissionKind(o.Kind)})
		}
		v := s.spec.Asker.Ask(ctx, q)
		switch {
		case v.Option != "":
			return map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": v.Option}}
		case v.Allow:
			return pick("allow_once", "allow_always")
		}
		return pick("reject_once", "reject_always")
	}
	return pick("allow_once", "allow_always")
}

// refuse reports a refused file request as an error event and answers it.
func (s *session) refuse(what string, err error) *acpsdk.RequestError {
	s.mu.Lock()
	s.emit(schemas.Errorf("refused %s: %v", what, err))
	s.mu.Unlock()
	return &acpsdk.RequestError{Code: -32000, Message: err.Error()}
}

func (s *session) readTextFile(params json.RawMessage) (any, *acpsdk.RequestError) {
	var p struct {
		Path  string `json:"path"`
		Line  *int   `json:"line"`
		Limit *int   `json:"limit"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &acpsdk.RequestError{Code: -32602, Message: "fs/read_text_file: " + err.Error()}
	}
	if ok, why := decide(s.spec.Policy, "fs/read_text_file"); !ok {
		return nil, s.refuse("a file read of "+p.Path, errors.New(why))
	}
	content, err := readText(s.ws, p.Path, p.Line, p.Limit)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist) && s.agent == AgentGemini:
		// gemini 0.61.0 does not recognise an error for a missing file
		// and then cannot create it; an empty file it handles.
		content = ""
	case errors.Is(err, fs.ErrNotExist):
		return nil, &acpsdk.RequestError{Code: -32000, Message: err.Error()}
	default:
		return nil, s.refuse("a file read of "+p.Path, err)
	}
	return map[string]string{"content": content}, nil
}

func (s *session) writeTextFile(params json.RawMessage) (any, *acpsdk.RequestError) {
	var p struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &acpsdk.RequestError{Code: -32602, Message: "fs/write_text_file: " + err.Error()}
	}
	if ok, why := decide(s.spec.Policy, "fs/write_text_file"); !ok {
		return nil, s.refuse("a file write to "+p.Path, errors.New(why))
	}
	if err := writeText(s.ws, p.Path, p.Content); err != nil {
		return nil, s.refuse("a file write to "+p.Path, err)
	}
	return nil, nil
}

// Interrupt implements backend.Session with session/cancel; the tool
// calls still open are retired as cancelled.
func (s *session) Interrupt(ctx context.Context) (bool, error) {
	s.mu.Lock()
	if s.dead || s.active == 0 {
		s.mu.Unlock()
		return false, nil
	}
	s.interrupted = s.active
	s.mu.Unlock()
	if err := s.conn.SendNotification(ctx, "session/cancel", map[string]string{"sessionId": s.sid}); err != nil {
		return false, fmt.Errorf("send session/cancel: %w", err)
	}
	s.mu.Lock()
	for _, p := range s.m.retire("cancelled") {
		s.emit(p)
	}
	s.mu.Unlock()
	return true, nil
}

// SetModel implements backend.ModelSetter. model is a model id, or a
// whole acp:<agent>:<model> naming this agent.
func (s *session) SetModel(ctx context.Context, model string) (string, error) {
	rest, ok := strings.CutPrefix(model, backend.BackendACP+":")
	if !ok {
		return "", fmt.Errorf("%q is not an ACP model (acp:%s:<model>)", model, s.agent)
	}
	agent, m, err := SplitModel(rest)
	if err != nil {
		return "", err
	}
	if agent != s.agent {
		return "", fmt.Errorf("this agent is acp:%s; it cannot become acp:%s", s.agent, agent)
	}
	if m == "" {
		return "", errors.New("no model given")
	}
	if err := s.set(ctx, "model", m); err != nil {
		s.mu.Lock()
		s.emit(schemas.Errorf("%v", err))
		s.mu.Unlock()
		return "", err
	}
	s.mu.Lock()
	s.model = m
	s.mu.Unlock()
	return backend.BackendACP + ":" + s.agent + ":" + m, nil
}

// Info implements backend.Session.
func (s *session) Info() backend.Info {
	return backend.Info{PID: s.proc.PID(), SessionID: s.sid}
}

// Close implements backend.Session: close stdin (opencode and gemini
// exit), then SIGTERM (claude-agent-acp ignores stdin's end; gemini
// ignores SIGTERM), then SIGKILL for the whole process group, which also
// takes whatever the agent started.
func (s *session) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.stop(ctx)
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) stop(ctx context.Context) {
	w := s.cfg.StopWait
	s.proc.Stop(ctx, []proc.Step{
		{Signal: proc.CloseStdin, Wait: w},
		{Signal: syscall.SIGTERM, Wait: w},
	})
}

// onExit reports the end of the process: an error unless Close asked for
// it, the open tool calls retired, a running turn ended, then status dead.
func (s *session) onExit() {
	s.mu.Lock()
	s.dead = true
	if !s.closing {
		msg := fmt.Sprintf("acp:%s exited: %s", s.agent, proc.ExitDescription(s.proc.Err()))
		if last := proc.LastLine(s.proc.StderrTail()); last != "" {
			msg += ": " + last
		}
		s.emit(schemas.ErrorWith(msg, map[string]string{"stderr": s.proc.StderrTail()}))
	}
	for _, p := range s.m.retire("agent exited") {
		s.emit(p)
	}
	if s.active != 0 {
		// What streamed is kept as authoritative; the node ends the turn,
		// since the agent did not.
		thought, text := s.m.takeTurnText()
		if strings.TrimSpace(thought) != "" {
			s.emit(schemas.Thought{Content: schemas.Text(thought)})
		}
		if strings.TrimSpace(text) != "" {
			s.emit(schemas.AssistantText{Content: schemas.Text(text)})
		}
		s.active = 0
	}
	if s.draining {
		s.draining = false
		close(s.drained)
	}
	s.emit(schemas.Status{Status: schemas.StatusDead})
	s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
	close(s.exited)
	s.cleanup()
}

// cleanup removes the agent's generated configuration, forgets its
// plugin credential and lets its workspace's directory go.
func (s *session) cleanup() {
	s.ws.close()
	if s.permits != nil {
		s.permits.remove(s.spec.AgentID)
	}
	if s.configDir != "" {
		os.RemoveAll(s.configDir)
	}
}
