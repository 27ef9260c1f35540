package node_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/acp"
	"github.com/shoalfabric/shoal/node/backend/claude"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/schemas"
)

// A backend under the contract: how to run a node with it, and how one of
// its agents dies mid-turn. Every harness's agents read a turn's text the
// same way: "stall …" runs until interrupted, "slow …" takes a while,
// anything else is answered "echo: <text>".
type harness struct {
	name  string
	model string
	// start returns the backend, run against whatever fake it needs.
	start func(t *testing.T) parts
}

// parts are a harness's backend and how its agents end.
type parts struct {
	be backend.Backend
	// kill ends an agent mid-turn, as a crash would; nil for a backend with
	// no process, whose "death" is gone.
	kill func(t *testing.T, f *fixture, id string)
	// gone takes the model server away: the turn then ends with an error
	// and the agent lives on.
	gone func()
}

// contractReply is what a fake model answers, the contract's way.
func contractReply(req fakemodel.Request) fakemodel.Reply {
	text := req.UserText
	switch {
	case strings.HasPrefix(text, "stall"):
		return fakemodel.Reply{Text: "thinking", Hang: true}
	case strings.HasPrefix(text, "slow"):
		return fakemodel.Reply{Text: "echo: " + text, ChunkSize: 3, Delay: 40 * time.Millisecond}
	}
	return fakemodel.Reply{Text: "echo: " + text}
}

// sigkill kills the agent's process group, as a crash would.
func sigkill(t *testing.T, f *fixture, id string) {
	t.Helper()
	if err := syscall.Kill(-pidOf(t, f, id), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
}

func harnesses() []harness {
	return []harness{
		{name: "fake", model: "sonnet",
			start: func(*testing.T) parts {
				b := fakebackend.New(fakebackend.Config{})
				return parts{be: b, kill: func(_ *testing.T, _ *fixture, id string) { b.Kill(id) }}
			}},
		{name: "claude-fake-cli", model: "sonnet",
			start: func(*testing.T) parts { return parts{be: claude.New(fakeCLI("contract")), kill: sigkill} }},
		{name: "claude", model: "sonnet",
			start: func(t *testing.T) parts {
				fake := fakemodel.Start(t, fakemodel.Config{Default: contractReply})
				return parts{be: claude.New(claude.Config{Path: peers.Claude.Command(t)[0], Env: peers.ClaudeEnv(t.TempDir(), fake.URL()), StopWait: time.Second}), kill: sigkill}
			}},
		{name: "acp-opencode", model: "acp:opencode",
			start: func(t *testing.T) parts {
				fake := fakemodel.Start(t, fakemodel.Config{Default: contractReply})
				env := peers.OpencodeEnv(t, t.TempDir(), fake.URL()+"/v1")
				return parts{be: acp.New(acp.Config{Commands: map[string][]string{acp.AgentOpencode: append(peers.Opencode.Command(t), "acp")}, Env: env, StopWait: time.Second}), kill: sigkill}
			}},
		{name: "acp-claude", model: "acp:claude",
			start: func(t *testing.T) parts {
				fake := fakemodel.Start(t, fakemodel.Config{Default: contractReply})
				env := peers.ClaudeEnv(t.TempDir(), fake.URL())
				return parts{be: acp.New(acp.Config{Commands: map[string][]string{acp.AgentClaude: peers.ClaudeACP.Command(t)}, Env: env, StopWait: time.Second}), kill: sigkill}
			}},
		{name: "ollama", model: "ollama:fake-model",
			start: func(t *testing.T) parts {
				fake := fakemodel.Start(t, fakemodel.Config{Default: contractReply})
				b, err := local.New(local.Config{Kind: backend.BackendOllama, Host: fake.URL()})
				if err != nil {
					t.Fatal(err)
				}
				return parts{be: b, gone: fake.Close}
			}},
	}
}

// Every backend passes the same contract, run through a real node: the
// node owns the turns (numbered, held while another runs, each with its
// own turn_started and result, in order), an interrupt ends the running
// turn and the held ones, a death or a close mid-turn ends every turn
// with the truth, and a reopened id goes on with its turn numbers.
func TestBackendContract(t *testing.T) {
	t.Parallel()
	for _, h := range harnesses() {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			// Each case has its own node and fakes, so one that takes a
			// model server away leaves the others theirs.
			type rig struct {
				*fixture
				parts
			}
			start := func(t *testing.T) rig {
				t.Parallel()
				p := h.start(t)
				return rig{startNode(t, fixtureOptions{node: func(c *node.Config) { c.Backends = []backend.Backend{p.be} }}), p}
			}
			t.Run("held turns run in order", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				texts := []string{"slow one two three", "second", "third"}
				for i, text := range texts {
					if n := f.send(id, text); n != i+1 {
						t.Fatalf("send %d was numbered turn %d", i+1, n)
					}
				}
				w.until(0, "turn 3's result", isResult(3))
				checkSequential(t, w, 3)
				for i, text := range texts {
					if got := turnText(w, i+1); got != "echo: "+text {
						t.Errorf("turn %d answered %q, want %q", i+1, got, "echo: "+text)
					}
				}
				// A run sent while a turn runs waits its turn and gets its
				// own answer.
				f.send(id, "slow four five")
				rep, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "fifth"})
				if err != nil || rep.Text != "echo: fifth" || rep.Turn != 5 || rep.StopReason != schemas.StopEndTurn {
					t.Errorf("a run behind a running turn: %+v %v", rep, err)
				}
			})
			t.Run("a burst of ten", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				for i := range 10 {
					f.send(id, fmt.Sprintf("burst %d", i+1))
				}
				w.until(0, "turn 10's result", isResult(10))
				checkSequential(t, w, 10)
				for i := range 10 {
					if got, want := turnText(w, i+1), fmt.Sprintf("echo: burst %d", i+1); got != want {
						t.Errorf("turn %d answered %q, want %q", i+1, got, want)
					}
				}
			})
			t.Run("an interrupt ends the running and the held turns", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				f.send(id, "stall here")
				f.send(id, "held back")
				w.until(0, "turn 1 streaming", func(ev schemas.Event) bool { return ev.Turn == 1 && ev.IsDelta() })
				if rep, err := f.fabric.Interrupt(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Interrupted {
					t.Fatalf("interrupt: %+v %v", rep, err)
				}
				w.until(0, "turn 2's result", isResult(2))
				if stop := stopOf(w, 1); stop != schemas.StopCancelled {
					t.Errorf("the interrupted turn ended %s", stop)
				}
				if stop, errs := stopOf(w, 2), turnErrors(w, 2); stop != schemas.StopCancelled || len(errs) != 1 || errs[0] != "turn 2 was interrupted before it began" {
					t.Errorf("the held turn ended %s with %q", stop, errs)
				}
				rep, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "after"})
				if err != nil || rep.Text != "echo: after" || rep.Turn != 3 {
					t.Errorf("the turn after the interrupt: %+v %v", rep, err)
				}
				w.until(0, "turn 3's result", isResult(3))
				checkSequential(t, w, 3)
			})
			t.Run("death mid-turn", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				ran := make(chan error, 1)
				go func() {
					_, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "stall forever"})
					ran <- err
				}()
				w.until(0, "turn 1 streaming", func(ev schemas.Event) bool { return ev.Turn == 1 && ev.IsDelta() })
				if f.kill == nil {
					// No process: the model server goes away mid-turn; the
					// turn ends with an error saying so, the run returns,
					// and the agent lives on.
					f.gone()
					if err := <-ran; err != nil {
						t.Errorf("the run of a turn whose model went away: %v", err)
					}
					w.until(0, "turn 1's result", isResult(1))
					if stop, errs := stopOf(w, 1), turnErrors(w, 1); stop != schemas.StopRefusal || len(errs) == 0 {
						t.Errorf("the turn whose model went away ended %s with %q", stop, errs)
					}
					if rec, err := f.fabric.Status(f.ctx(30*time.Second), id); err != nil || rec.Status != schemas.StatusIdle {
						t.Errorf("after its model went away: %+v %v", rec, err)
					}
					return
				}
				f.kill(t, f.fixture, id)
				w.until(0, "status dead", isStatus(schemas.StatusDead))
				if err := <-ran; schemas.CodeOf(err) != schemas.CodeUnavailable || err.Error() != "agent '"+id+"' died during the turn" {
					t.Errorf("the run of a turn whose agent died: %v", err)
				}
				if stop := stopOf(w, 1); stop != schemas.StopCancelled {
					t.Errorf("the turn ended %s", stop)
				}
				noIdleAfter(t, w, schemas.StatusDead)
			})
			t.Run("close mid-turn", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				f.send(id, "stall until closed")
				f.send(id, "never begins")
				w.until(0, "turn 1 streaming", func(ev schemas.Event) bool { return ev.Turn == 1 && ev.IsDelta() })
				if rep, err := f.fabric.Close(f.ctx(60*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Closed {
					t.Fatalf("close: %+v %v", rep, err)
				}
				w.until(0, "status dead", isStatus(schemas.StatusDead))
				if stop := stopOf(w, 1); stop != schemas.StopCancelled {
					t.Errorf("the running turn ended %s", stop)
				}
				if stop, errs := stopOf(w, 2), turnErrors(w, 2); stop != schemas.StopCancelled || len(errs) != 1 || errs[0] != "turn 2 was dropped: the agent was closed before it began" {
					t.Errorf("the held turn ended %s with %q", stop, errs)
				}
				checkSequential(t, w, 2)
				noIdleAfter(t, w, schemas.StatusClosed)
			})
			t.Run("a reopened id goes on with its turns", func(t *testing.T) {
				f := start(t)
				open := func(id string) (string, *watcher) {
					t.Helper()
					id = f.open(schemas.OpenRequest{Model: h.model, ID: id})
					return id, f.watch(id)
				}
				id, w := open("")
				f.send(id, "first life")
				w.until(0, "turn 1's result", isResult(1))
				f.fabric.Close(f.ctx(60*time.Second), schemas.AgentRequest{AgentID: id})
				dead := w.until(0, "status dead", isStatus(schemas.StatusDead))
				open(id)
				rep, err := f.fabric.Run(f.ctx(90*time.Second), schemas.RunRequest{AgentID: id, Text: "second life"})
				if err != nil || rep.Text != "echo: second life" || rep.Turn != 2 {
					t.Fatalf("the second life's first turn: %+v %v", rep, err)
				}
				if i := w.until(dead, "turn 2 begins", isKind(schemas.KindTurnStarted)); w.events()[i].Turn != 2 {
					t.Errorf("the second life began turn %d", w.events()[i].Turn)
				}
				for turn, want := range map[int]string{1: "echo: first life", 2: "echo: second life"} {
					out, err := f.fabric.Output(f.ctx(30*time.Second), schemas.OutputRequest{AgentID: id, Turn: &turn})
					if err != nil || out.Text != want {
						t.Errorf("output of turn %d: %+v %v", turn, out, err)
					}
				}
			})
		})
	}
}

// checkSequential checks that turns 1 to n each begin once, in order,
// and that each ends with its result before the next begins.
func checkSequential(t *testing.T, w *watcher, n int) {
	t.Helper()
	open := 0
	next := 1
	for _, e := range w.events() {
		switch e.Kind() {
		case schemas.KindTurnStarted:
			if open != 0 || e.Turn != next {
				t.Fatalf("turn %d began while turn %d was open (want turn %d next): %s", e.Turn, open, next, strings.Join(w.summary(0), " "))
			}
			open = e.Turn
		case schemas.KindResult:
			if e.Turn != open {
				t.Fatalf("a result of turn %d while turn %d was open: %s", e.Turn, open, strings.Join(w.summary(0), " "))
			}
			open, next = 0, next+1
		}
	}
	if next != n+1 {
		t.Fatalf("%d turns ended, want %d: %s", next-1, n, strings.Join(w.summary(0), " "))
	}
}

// turnText is a turn's last authoritative assistant text.
func turnText(w *watcher, turn int) string {
	text := ""
	for _, e := range w.events() {
		if a, ok := e.Payload.(schemas.AssistantText); ok && !a.Delta && e.Turn == turn {
			text = a.Content.Text
		}
	}
	return text
}

func stopOf(w *watcher, turn int) schemas.StopReason {
	for _, e := range w.events() {
		if r, ok := e.Payload.(schemas.Result); ok && e.Turn == turn {
			return r.StopReason
		}
	}
	return ""
}

func turnErrors(w *watcher, turn int) []string {
	var out []string
	for _, e := range w.events() {
		if p, ok := e.Payload.(schemas.Error); ok && e.Turn == turn {
			out = append(out, p.Message)
		}
	}
	return out
}

// noIdleAfter checks that no status idle follows the first status s.
func noIdleAfter(t *testing.T, w *watcher, s schemas.AgentStatus) {
	t.Helper()
	seen := false
	for _, e := range w.events() {
		st, ok := e.Payload.(schemas.Status)
		if !ok {
			continue
		}
		if seen && st.Status == schemas.StatusIdle {
			t.Errorf("status idle after status %s: %s", s, strings.Join(w.summary(0), " "))
			return
		}
		seen = seen || st.Status == s
	}
}
