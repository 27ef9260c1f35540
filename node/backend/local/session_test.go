package local

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// events is a sink that keeps every event, checked against the schemas.
type events struct {
	t    *testing.T
	mu   sync.Mutex
	all  []schemas.Event
	more chan struct{}
	turn int // the turn events are stamped with, as the node does
}

func (e *events) Emit(ev schemas.Event) {
	b, err := schemas.Encode(ev)
	if err != nil {
		e.t.Errorf("an event does not encode: %v", err)
	} else {
		schematest.Event(e.t, b)
	}
	e.mu.Lock()
	ev.Turn = e.turn
	e.all = append(e.all, ev)
	e.mu.Unlock()
	select {
	case e.more <- struct{}{}:
	default:
	}
}

// result waits for turn n's result and returns the turn's events.
func (e *events) result(n int) []schemas.Event {
	e.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		e.mu.Lock()
		var turn []schemas.Event
		for _, ev := range e.all {
			if ev.Turn == n {
				turn = append(turn, ev)
			}
		}
		e.mu.Unlock()
		if len(turn) > 0 {
			if _, ok := turn[len(turn)-1].Payload.(schemas.Result); ok {
				return turn
			}
		}
		select {
		case <-e.more:
		case <-deadline:
			e.t.Fatalf("turn %d has no result: %s", n, kinds(turn))
		}
	}
}

func kinds(evs []schemas.Event) string {
	var out []string
	for _, ev := range evs {
		k := string(ev.Kind())
		if ev.IsDelta() {
			k += "~"
		}
		if e, ok := ev.Payload.(schemas.Error); ok {
			k += "(" + e.Message + ")"
		}
		if r, ok := ev.Payload.(schemas.Result); ok {
			k += "(" + string(r.StopReason) + ")"
		}
		out = append(out, k)
	}
	return strings.Join(out, " ")
}

// dialects are the servers a local-model agent can run on, as the fake
// speaks them.
var dialects = []struct {
	name string
	kind string
	mlx  bool
}{
	{"ollama", backend.BackendOllama, false},
	{"mlx", backend.BackendVMLX, true},
}

// startLocal starts an agent of kind against fake, with the test MCP
// server over stdio as its mcp_config, under pol.
func startLocal(t *testing.T, kind string, fake *fakemodel.Server, pol schemas.Policy) (backend.Session, *events) {
	t.Helper()
	srv := stdioTestServer(t, "tools")
	env := map[string]string{}
	for _, kv := range srv.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"tools": map[string]any{"command": srv.Command, "env": env}}})
	cfgPath := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Kind: kind, Host: fake.URL()})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, more: make(chan struct{}, 1)}
	sess, err := b.Start(t.Context(), backend.Spec{AgentID: "l1", CWD: t.TempDir(), Model: "fake-model", Policy: pol, MCPConfig: cfgPath}, ev)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { sess.Close(t.Context()) })
	return sess, ev
}

func policy(t *testing.T, preset string, disallowed ...string) schemas.Policy {
	t.Helper()
	var deny *[]string
	if disallowed != nil {
		deny = &disallowed
	}
	pol, err := schemas.ComposePolicy(preset, "", nil, deny, false)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// send gives the session the next turn, numbered and stamped as the node
// would.
func (e *events) send(s backend.Session, text string) int {
	e.t.Helper()
	e.mu.Lock()
	e.turn++
	n := e.turn
	e.mu.Unlock()
	if err := s.Prompt(e.t.Context(), n, text); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A turn streams thinking and text, then repeats them as authoritative
// blocks; a tool call goes to the MCP server over stdio and its result
// back to the model; an image stays an image block on the stream; usage
// adds up over the rounds.
func TestLocalTurnWithTools(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			fake := fakemodel.Start(t, fakemodel.Config{MLX: d.mlx})
			fake.Script(
				fakemodel.Reply{Thinking: "Let me check.", Text: "Calling.", ToolCalls: []fakemodel.ToolCall{
					{Name: "echo", Input: json.RawMessage(`{"text":"ping-42"}`)},
					{Name: "picture", Input: json.RawMessage(`{}`)},
				}, Usage: fakemodel.Usage{Input: 100, Output: 20}},
				fakemodel.Reply{Text: "The tool said ping-42.", Usage: fakemodel.Usage{Input: 150, Output: 8}},
			)
			s, ev := startLocal(t, d.kind, fake, policy(t, "default"))
			evs := ev.result(ev.send(s, "use the tools"))
			got := kinds(evs)
			for _, want := range []string{"thought~", "thought ", "assistant_text~", "tool_use", "tool_result", "result(end_turn)"} {
				if !strings.Contains(got+" ", want) {
					t.Fatalf("no %s in %s", want, got)
				}
			}
			var echoed, image bool
			var final string
			for _, e := range evs {
				switch p := e.Payload.(type) {
				case schemas.ToolResult:
					if p.Update.Status == nil || *p.Update.Status != schemas.ToolCompleted {
						t.Errorf("tool result %+v", p.Update)
					}
					for _, c := range p.Update.Content {
						echoed = echoed || strings.Contains(c.Content.Text, "ping-42")
						image = image || c.Content.Type == schemas.ContentImage
					}
				case schemas.AssistantText:
					if !p.Delta {
						final = p.Content.Text
					}
				case schemas.Result:
					if p.Usage == nil || p.Usage.InputTokens != 250 || p.Usage.OutputTokens != 28 {
						t.Errorf("usage %+v", p.Usage)
					}
				}
			}
			if !echoed || !image || final != "The tool said ping-42." {
				t.Fatalf("echoed %v image %v final %q: %s", echoed, image, final, got)
			}
			reqs := fake.Requests()
			if len(reqs) != 2 || !strings.Contains(string(reqs[1].Body), "ping-42") || !strings.Contains(string(reqs[1].Body), "[image returned: image/png]") {
				t.Fatalf("the tool results did not go back to the model: %d requests", len(reqs))
			}
		})
	}
}

// The preset's deny list hides a tool from the model, and a call of it
// anyway is refused without reaching the server.
func TestLocalPresetFiltersTools(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			fake := fakemodel.Start(t, fakemodel.Config{MLX: d.mlx})
			fake.Script(
				fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "picture", Input: json.RawMessage(`{}`)}}},
				fakemodel.Reply{Text: "done"},
			)
			s, ev := startLocal(t, d.kind, fake, policy(t, "default", "mcp__tools__picture"))
			evs := ev.result(ev.send(s, "draw"))
			offered := string(fake.Requests()[0].Body)
			if strings.Contains(offered, `"picture"`) || !strings.Contains(offered, `"echo"`) {
				t.Fatalf("the tools offered: %s", offered)
			}
			refused := false
			for _, e := range evs {
				if r, ok := e.Payload.(schemas.ToolResult); ok && r.Update.Status != nil && *r.Update.Status == schemas.ToolFailed {
					for _, c := range r.Update.Content {
						refused = refused || strings.Contains(c.Content.Text, "tool 'picture' is not permitted")
					}
				}
			}
			if !refused {
				t.Fatalf("the hidden tool was not refused: %s", kinds(evs))
			}
		})
	}
}

// A stream that fails midway is an error, then a refusal; a model that
// calls tools forever stops at 24 rounds; an interrupted turn ends
// cancelled, and the next one works.
func TestLocalFailuresAndInterrupt(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			loop := fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "echo", Input: json.RawMessage(`{"text":"again"}`)}}}
			var mu sync.Mutex
			looping := false
			fake := fakemodel.Start(t, fakemodel.Config{MLX: d.mlx, Default: func(fakemodel.Request) fakemodel.Reply {
				mu.Lock()
				defer mu.Unlock()
				if looping {
					return loop
				}
				return fakemodel.Reply{Text: "fine"}
			}})
			s, ev := startLocal(t, d.kind, fake, policy(t, "default"))

			fake.Script(fakemodel.Reply{Text: "half an answer", MidStreamError: "the GPU fell over"})
			evs := ev.result(ev.send(s, "try"))
			// The server's words, named once by the agent's kind (they
			// said "ollama: ollama: …" and "vmlx: openai: …").
			if got := kinds(evs); !strings.Contains(got, "error("+d.kind+": the GPU fell over)") || !strings.HasSuffix(got, "result(refusal)") {
				t.Fatalf("mid-stream error: %s", got)
			}

			mu.Lock()
			looping = true
			mu.Unlock()
			before := len(fake.Requests())
			evs = ev.result(ev.send(s, "loop"))
			if got := kinds(evs); !strings.Contains(got, "hit max tool rounds (24)") || !strings.HasSuffix(got, "result(refusal)") {
				t.Fatalf("round limit: %s", got)
			}
			if n := len(fake.Requests()) - before; n != DefaultMaxRounds {
				t.Fatalf("%d model requests in the looping turn, want %d", n, DefaultMaxRounds)
			}
			mu.Lock()
			looping = false
			mu.Unlock()

			fake.Script(fakemodel.Reply{Text: "slow and endless", Hang: true})
			n := ev.send(s, "hang")
			waitRequests(t, fake, before+DefaultMaxRounds+1)
			if ok, err := s.Interrupt(t.Context()); !ok || err != nil {
				t.Fatalf("interrupt: %v %v", ok, err)
			}
			cut := ev.result(n)
			if got := kinds(cut); !strings.HasSuffix(got, "result(cancelled)") {
				t.Fatalf("interrupted turn: %s", got)
			}
			// The model never said what the cut-off turn used: its usage is
			// unknown (none), not zero.
			if r := cut[len(cut)-1].Payload.(schemas.Result); r.Usage != nil {
				t.Errorf("the interrupted turn reports usage %+v; the model reported none", *r.Usage)
			}
			evs = ev.result(ev.send(s, "and now"))
			if got := kinds(evs); !strings.HasSuffix(got, "result(end_turn)") {
				t.Fatalf("after the interrupt: %s", got)
			}
		})
	}
}

func waitRequests(t *testing.T, fake *fakemodel.Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(fake.Requests()) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the model got %d requests, want %d", len(fake.Requests()), n)
		}
	}
}
