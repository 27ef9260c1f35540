package acp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/schemas"
)

// recorder is a sink that keeps every event and lets a test wait for one.
type recorder struct {
	t      *testing.T
	mu     sync.Mutex
	events []schemas.Event
	more   chan struct{}
	turn   int // the turn events are stamped with, as the node does
}

// send gives the session the next turn, numbered and stamped as the
// node would.
func (r *recorder) send(sess backend.Session, text string) (int, error) {
	r.mu.Lock()
	r.turn++
	n := r.turn
	r.mu.Unlock()
	return n, sess.Prompt(r.t.Context(), n, text)
}

func newRecorder(t *testing.T) *recorder { return &recorder{t: t, more: make(chan struct{}, 1)} }

func (r *recorder) Emit(ev schemas.Event) {
	b, err := schemas.Encode(ev)
	if err != nil {
		r.t.Errorf("an event does not encode: %v", err)
	} else {
		schematest.Event(r.t, b)
	}
	r.mu.Lock()
	ev.Turn = r.turn
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.more <- struct{}{}:
	default:
	}
}

// since returns the events from index i on.
func (r *recorder) since(i int) []schemas.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]schemas.Event(nil), r.events[min(i, len(r.events)):]...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// waitFor waits for an event from index i on that match accepts, and
// returns the events up to it.
func (r *recorder) waitFor(i int, what string, match func(schemas.Event) bool) []schemas.Event {
	r.t.Helper()
	deadline := time.After(90 * time.Second)
	for {
		evs := r.since(i)
		for j, ev := range evs {
			if match(ev) {
				return evs[:j+1]
			}
		}
		select {
		case <-r.more:
		case <-deadline:
			r.t.Fatalf("no %s; events: %s", what, summary(evs))
		}
	}
}

// result waits for turn n's result and returns the turn's events.
func (r *recorder) result(i, n int) []schemas.Event {
	r.t.Helper()
	return r.waitFor(i, "result of turn", func(ev schemas.Event) bool {
		_, ok := ev.Payload.(schemas.Result)
		return ok && ev.Turn == n
	})
}

func summary(evs []schemas.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.IsDelta() {
			continue
		}
		b.WriteString(string(ev.Kind()))
		switch p := ev.Payload.(type) {
		case schemas.Error:
			b.WriteString("(" + p.Message + ")")
		case schemas.Result:
			b.WriteString("(" + string(p.StopReason) + ")")
		case schemas.AssistantText:
			b.WriteString("(" + p.Content.Text + ")")
		}
		b.WriteString(" ")
	}
	return b.String()
}

// finalText is the turn's authoritative assistant text.
func finalText(evs []schemas.Event) string {
	text := ""
	for _, ev := range evs {
		if a, ok := ev.Payload.(schemas.AssistantText); ok && !a.Delta {
			text = a.Content.Text
		}
	}
	return text
}

// resultCost is the cost of the turn's result, or nil.
func resultCost(evs []schemas.Event) *float64 {
	for _, ev := range evs {
		if r, ok := ev.Payload.(schemas.Result); ok && r.Usage != nil {
			return r.Usage.CostUSD
		}
	}
	return nil
}

func costText(c *float64) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("$%.6f", *c)
}

func errorsIn(evs []schemas.Event) []string {
	var out []string
	for _, ev := range evs {
		if e, ok := ev.Payload.(schemas.Error); ok {
			out = append(out, e.Message)
		}
	}
	return out
}

func has[T schemas.Payload](evs []schemas.Event) bool {
	for _, ev := range evs {
		if _, ok := ev.Payload.(T); ok {
			return true
		}
	}
	return false
}

// agentRig is one ACP agent run by the backend against a fake model.
type agentRig struct {
	t    *testing.T
	sess backend.Session
	rec  *recorder
	cwd  string
	fake *fakemodel.Server
	turn int
}

func startAgent(t *testing.T, agent, preset string, env peers.Env, command []string, fake *fakemodel.Server) *agentRig {
	t.Helper()
	pol, err := schemas.ComposePolicy(preset, "", nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	b := acp.New(acp.Config{Commands: map[string][]string{agent: command}, Env: env, StopWait: time.Second})
	t.Cleanup(func() { b.Close() })
	rec := newRecorder(t)
	cwd := t.TempDir()
	cwd, _ = filepath.EvalSymlinks(cwd)
	var stderr strings.Builder
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sess, err := b.Start(ctx, backend.Spec{
		AgentID: "a1", CWD: cwd, Model: agent, Policy: pol, Dir: t.TempDir(),
		Stderr: writerFunc(func(p []byte) { mu.Lock(); stderr.Write(p); mu.Unlock() }),
	}, rec)
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("start acp:%s: %v\n%s", agent, err, stderr.String())
	}
	r := &agentRig{t: t, sess: sess, rec: rec, cwd: cwd, fake: fake}
	t.Cleanup(func() {
		if t.Failed() {
			for i, q := range fake.Requests() {
				t.Logf("model request %d: %s %q", i+1, q.Path, q.UserText)
			}
			mu.Lock()
			t.Logf("acp:%s wrote (stderr and stdout):\n%s", agent, tail(stderr.String(), 6000))
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		sess.Close(ctx)
	})
	return r
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// send sends a turn and returns its events up to its result.
func (r *agentRig) send(text string) []schemas.Event {
	r.t.Helper()
	from := r.rec.len()
	n, err := r.rec.send(r.sess, text)
	if err != nil {
		r.t.Fatalf("send: %v", err)
	}
	if n != r.turn+1 {
		r.t.Fatalf("turn %d, want %d", n, r.turn+1)
	}
	r.turn = n
	return r.rec.result(from, n)
}

// closeAndCheck closes the agent and checks nothing of it is left.
func (r *agentRig) closeAndCheck() {
	r.t.Helper()
	pid := r.sess.Info().PID
	ctx, cancel := context.WithTimeout(r.t.Context(), time.Minute)
	defer cancel()
	if err := r.sess.Close(ctx); err != nil {
		r.t.Fatalf("close: %v", err)
	}
	evs := r.rec.since(0)
	if st, ok := evs[len(evs)-1].Payload.(schemas.Status); !ok || st.Status != schemas.StatusDead {
		r.t.Fatalf("the last event after close is %s, want status dead", summary(evs[len(evs)-1:]))
	}
	// What the group's SIGKILL hit is gone once its parent, or init, has
	// reaped it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := syscall.Kill(-pid, 0)
		if err == syscall.ESRCH {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the agent's process group %d is still there 10s after close (%v)", pid, err)
		}
	}
}

// The opencode ACP agent, pinned, against the fake model: a turn; a tool
// call that asks permission, allowed under default; a write through
// fs/write_text_file inside the directory; one outside it and one through
// a symlink refused; a model switch; an interrupted turn that reports
// cancelled, and a next turn whose output is its own; a close that leaves
// no process.
func TestOpencode(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	home := t.TempDir()
	env := peers.OpencodeEnv(t, home, fake.URL()+"/v1")
	r := startAgent(t, acp.AgentOpencode, "default", env, append(peers.Opencode.Command(t), "acp"), fake)

	fake.Script(fakemodel.Reply{Text: "hello from the fake"})
	if evs := r.send("say hello"); finalText(evs) != "hello from the fake" {
		t.Fatalf("turn 1: %s", summary(evs))
	}

	// A shell command asks permission; default allows it.
	fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: json.RawMessage(`{"command":"echo hi-from-bash","description":"echo"}`)}}},
		fakemodel.Reply{Text: "ran it"},
	)
	evs := r.send("run echo")
	if !has[schemas.Permission](evs) || !has[schemas.ToolUse](evs) || finalText(evs) != "ran it" {
		t.Fatalf("turn 2: %s", summary(evs))
	}
	if errs := errorsIn(evs); len(errs) > 0 {
		t.Fatalf("turn 2 errors: %q", errs)
	}

	// Writes go through fs/write_text_file, confined to the directory.
	writes(t, r, "write", "filePath", false, false)

	// The model can be switched in place.
	if m, err := r.sess.(backend.ModelSetter).SetModel(t.Context(), "acp:opencode:fake/fake-model"); m != "acp:opencode:fake/fake-model" || err != nil {
		t.Fatalf("set_model: %q %v; events %s", m, err, summary(r.rec.since(0)))
	}
	if m, err := r.sess.(backend.ModelSetter).SetModel(t.Context(), "fake/fake-model"); m != "" || err == nil {
		t.Errorf("set_model without acp:opencode: switched to %q (%v); Kaimon requires the full id", m, err)
	}

	// An interrupted turn reports cancelled; the next turn's output is its own.
	fake.Script(fakemodel.Reply{Text: strings.Repeat("slow ", 200), ChunkSize: 5, Delay: 50 * time.Millisecond})
	from := r.rec.len()
	n, err := r.rec.send(r.sess, "go slowly")
	if err != nil {
		t.Fatal(err)
	}
	r.turn = n
	r.rec.waitFor(from, "a streamed chunk", func(ev schemas.Event) bool { return ev.IsDelta() && ev.Turn == n })
	if ok, err := r.sess.Interrupt(t.Context()); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	evs = r.rec.result(from, n)
	if res := evs[len(evs)-1].Payload.(schemas.Result); res.StopReason != schemas.StopCancelled {
		t.Fatalf("the interrupted turn ended %s: %s", res.StopReason, summary(evs))
	}
	fake.Script(fakemodel.Reply{Text: "after the interrupt"})
	if evs := r.send("and now"); finalText(evs) != "after the interrupt" {
		t.Fatalf("the turn after the interrupt: %s", summary(evs))
	}
	r.closeAndCheck()
}

// failedTool reports whether a tool call of the turn failed.
func failedTool(evs []schemas.Event) bool {
	for _, ev := range evs {
		if r, ok := ev.Payload.(schemas.ToolResult); ok && r.Update.Status != nil && *r.Update.Status == schemas.ToolFailed {
			return true
		}
	}
	return false
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func anyContains(xs []string, sub string) bool {
	for _, x := range xs {
		if strings.Contains(x, sub) {
			return true
		}
	}
	return false
}

// Under notebook, opencode's shell is refused, with an error event that
// says why, and the command never runs.
func TestOpencodeNotebookRefusesTheShell(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	env := peers.OpencodeEnv(t, t.TempDir(), fake.URL()+"/v1")
	r := startAgent(t, acp.AgentOpencode, "notebook", env, append(peers.Opencode.Command(t), "acp"), fake)
	marker := filepath.Join(r.cwd, "ran")
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "bash", Input: mustJSON(t, map[string]string{"command": "touch " + marker, "description": "touch"})}}})
	evs := r.send("run it")
	if !anyContains(errorsIn(evs), "refused a tool call") {
		t.Fatalf("no refusal: %s", summary(evs))
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the refused command ran")
	}

	// opencode reads files without asking; Shoal's plugin refuses the
	// read before it runs, and the content never reaches the stream.
	secret := filepath.Join(r.cwd, "secret.txt")
	if err := os.WriteFile(secret, []byte("the-secret-content"), 0o600); err != nil {
		t.Fatal(err)
	}
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "read", Input: mustJSON(t, map[string]string{"filePath": secret})}}})
	evs = r.send("read it")
	if !anyContains(errorsIn(evs), "refused a tool call: read") {
		t.Fatalf("the plugin did not refuse the read: %s", summary(evs))
	}
	for _, ev := range evs {
		if b, _ := schemas.Encode(ev); strings.Contains(string(b), "the-secret-content") {
			t.Fatalf("the refused read's content reached the stream: %s", b)
		}
	}
	r.closeAndCheck()
}

// claude-agent-acp, pinned, against the fake model: a turn; a Write,
// which asks permission, allowed inside the directory and refused outside
// it and through a symlink (claude does its own file IO, so the refusal
// is the permission answer); notebook refusing the shell; a model switch;
// an interrupt, after which each turn's output is its own despite the
// agent answering the next prompt early; a close that leaves no process.
func TestClaudeAgentACP(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	env := peers.ClaudeEnv(t.TempDir(), fake.URL())
	r := startAgent(t, acp.AgentClaude, "default", env, peers.ClaudeACP.Command(t), fake)

	fake.Script(fakemodel.Reply{Text: "hello from the fake"})
	first := r.send("say hello")
	if finalText(first) != "hello from the fake" {
		t.Fatalf("turn 1: %s", summary(first))
	}
	// claude-agent-acp's usage_update reports the session's cost so far;
	// a turn's result carries its own: a second turn like the first costs
	// about as much, not the two turns' total.
	fake.Script(fakemodel.Reply{Text: "hello from the fake"})
	second := r.send("say hello")
	c1, c2 := resultCost(first), resultCost(second)
	if c1 == nil || c2 == nil || *c1 <= 0 || *c2 <= 0 || *c2 > 1.5**c1 {
		t.Fatalf("turn costs %s and %s: want each turn's own, both above 0, the second no more than half again the first", costText(c1), costText(c2))
	}

	// claude does its own file IO: a Write asks permission, and Shoal's
	// answer confines it.
	writes(t, r, "Write", "file_path", true, false)

	if m, err := r.sess.(backend.ModelSetter).SetModel(t.Context(), "acp:"+acp.AgentClaude+":default"); m != "acp:"+acp.AgentClaude+":default" || err != nil {
		t.Fatalf("set_model: %q %v; events %s", m, err, summary(r.rec.since(0)))
	}

	interruptThenTwoTurns(t, r)
	r.closeAndCheck()
}

// Under notebook, gemini's write is refused with an error event; since gemini takes neither Shoal's plugin nor claude's
// options, an error says at open that its own tools are bound only where
// it asks.
func TestGeminiNotebook(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	env := peers.GeminiEnv(t, t.TempDir(), fake.URL())
	r := startAgent(t, acp.AgentGemini, "notebook", env, append(peers.Gemini.Command(t), "--acp"), fake)
	if !anyContains(errorsIn(r.rec.since(0)), "acp:gemini loads neither Shoal's plugin nor the _meta.claudeCode options") {
		t.Fatalf("no notice that the preset binds only asked tools: %s", summary(r.rec.since(0)))
	}
	target := filepath.Join(r.cwd, "notebook.txt")
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "write_file", Input: mustJSON(t, map[string]string{"file_path": target, "content": "must not land"})}}})
	evs := r.send("write it")
	if _, err := os.Stat(target); err == nil {
		t.Fatalf("notebook let gemini write: %s", summary(evs))
	}
	// gemini first checks whether the file exists, a read the preset
	// refuses too.
	if !anyContains(errorsIn(evs), "refused a") {
		t.Fatalf("nothing refused: %s", summary(evs))
	}
	r.closeAndCheck()
}

// Under notebook, claude-agent-acp is started without its file and shell
// tools (the deny list goes in _meta.claudeCode.options): a Write the
// model asks for fails and writes nothing.
func TestClaudeAgentACPNotebook(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	env := peers.ClaudeEnv(t.TempDir(), fake.URL())
	r := startAgent(t, acp.AgentClaude, "notebook", env, peers.ClaudeACP.Command(t), fake)
	target := filepath.Join(r.cwd, "notebook.txt")
	fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Write", Input: mustJSON(t, map[string]string{"file_path": target, "content": "must not land"})}}})
	evs := r.send("write it")
	if _, err := os.Stat(target); err == nil {
		t.Fatalf("notebook let claude write: %s", summary(evs))
	}
	if !failedTool(evs) && !anyContains(errorsIn(evs), "refused a tool call") {
		t.Fatalf("nothing says the write failed: %s", summary(evs))
	}
	if errs := errorsIn(r.rec.since(0)); anyContains(errs, "loads neither") {
		t.Fatalf("claude-agent-acp takes the options, yet: %q", errs)
	}
	r.closeAndCheck()
}

// writes checks an agent's file writes by its write tool (the argument
// naming the file is pathKey): one inside the directory lands; one
// outside it and one through a symlink that leads outside are refused,
// with an error event unless the agent refuses them itself (a failed
// tool call), and write nothing.
func writes(t *testing.T, r *agentRig, tool, pathKey string, wantPermission, agentMayRefuse bool) {
	t.Helper()
	inside := filepath.Join(r.cwd, "notes", "inside.txt")
	r.fake.Script(
		fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: tool, Input: mustJSON(t, map[string]string{pathKey: inside, "content": "written by the agent"})}}},
		fakemodel.Reply{Text: "wrote it"},
	)
	evs := r.send("write a file")
	if b, err := os.ReadFile(inside); err != nil || string(b) != "written by the agent" || (wantPermission && !has[schemas.Permission](evs)) {
		t.Fatalf("the file inside: %q %v; events %s", b, err, summary(evs))
	}
	outsideDir := t.TempDir()
	if err := os.Symlink(outsideDir, filepath.Join(r.cwd, "escape")); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{filepath.Join(outsideDir, "outside.txt"), filepath.Join(r.cwd, "escape", "through-link.txt")} {
		// A refused call may end the turn without another model request.
		r.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: tool, Input: mustJSON(t, map[string]string{pathKey: target, "content": "must not land"})}}})
		evs = r.send("write outside")
		if _, err := os.Stat(filepath.Join(outsideDir, filepath.Base(target))); err == nil {
			t.Fatalf("%s was written; events %s", target, summary(evs))
		}
		if !anyContains(errorsIn(evs), "outside this agent's workspace") && !(agentMayRefuse && failedTool(evs)) {
			t.Fatalf("no refusal for %s: %s", target, summary(evs))
		}
	}
}

// interruptThenTwoTurns interrupts a slow turn, then checks that each of
// the next two turns ends with its own answer.
func interruptThenTwoTurns(t *testing.T, r *agentRig) {
	t.Helper()
	r.fake.Script(fakemodel.Reply{Text: strings.Repeat("slow ", 200), ChunkSize: 5, Delay: 50 * time.Millisecond})
	from := r.rec.len()
	n, err := r.rec.send(r.sess, "go slowly")
	if err != nil {
		t.Fatal(err)
	}
	r.turn = n
	r.rec.waitFor(from, "a streamed chunk", func(ev schemas.Event) bool { return ev.IsDelta() && ev.Turn == n })
	if ok, err := r.sess.Interrupt(t.Context()); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	evs := r.rec.result(from, n)
	if res := evs[len(evs)-1].Payload.(schemas.Result); res.StopReason != schemas.StopCancelled {
		t.Fatalf("the interrupted turn ended %s: %s", res.StopReason, summary(evs))
	}
	for _, answer := range []string{"first after the interrupt", "second after the interrupt"} {
		r.fake.Script(fakemodel.Reply{Text: answer})
		if evs := r.send("next"); finalText(evs) != answer {
			t.Fatalf("turn %d: want %q, got %s", r.turn, answer, summary(evs))
		}
	}
}

// gemini, pinned, against the fake model: a turn; a write, which asks
// permission and goes through fs/write_text_file (after a read of the
// missing file), inside the directory; refused outside it and through a
// symlink; a model switch; an interrupt; a close that leaves no process
// although gemini ignores SIGTERM.
func TestGemini(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	env := peers.GeminiEnv(t, t.TempDir(), fake.URL())
	r := startAgent(t, acp.AgentGemini, "default", env, append(peers.Gemini.Command(t), "--acp"), fake)

	fake.Script(fakemodel.Reply{Text: "hello from the fake"})
	if evs := r.send("say hello"); finalText(evs) != "hello from the fake" {
		t.Fatalf("turn 1: %s", summary(evs))
	}

	// gemini asks permission, reads the missing file, then writes through
	// fs/write_text_file; it keeps to its workspace on its own too, so a
	// path outside fails before anything reaches Shoal.
	writes(t, r, "write_file", "file_path", true, true)

	if m, err := r.sess.(backend.ModelSetter).SetModel(t.Context(), "acp:"+acp.AgentGemini+":gemini-3.8-flash"); m != "acp:"+acp.AgentGemini+":gemini-3.8-flash" || err != nil {
		t.Fatalf("set_model: %q %v; events %s", m, err, summary(r.rec.since(0)))
	}

	interruptThenTwoTurns(t, r)
	r.closeAndCheck()
}
