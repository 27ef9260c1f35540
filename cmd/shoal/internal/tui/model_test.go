package tui

import (
	"context"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/shoalfabric/shoal/schemas"
)

// staticFabric answers with fixed records and no events.
type staticFabric struct {
	agents []schemas.AgentRecord
	closed []string
}

func (f *staticFabric) Agents(context.Context) ([]schemas.AgentRecord, error) { return f.agents, nil }
func (f *staticFabric) Nodes(context.Context) ([]schemas.NodeRecord, error)   { return nil, nil }
func (f *staticFabric) Follow(ctx context.Context, _ func(string, schemas.Event)) error {
	<-ctx.Done()
	return ctx.Err()
}
func (f *staticFabric) History(context.Context, string, int) ([]schemas.Event, error) {
	return nil, nil
}
func (f *staticFabric) Close(_ context.Context, id string) error {
	f.closed = append(f.closed, id)
	return nil
}

func newTestModel(t *testing.T, agents ...schemas.AgentRecord) (*Model, *staticFabric) {
	src := &staticFabric{agents: agents}
	m := New(t.Context(), src, Options{})
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 30})
	m.Update(agentsMsg(agents))
	return m, src
}

func key(m *Model, k string) tea.Cmd {
	var msg tea.KeyMsg
	switch k {
	case "enter":
		msg = tea.KeyMsg{Type: tea.KeyEnter}
	case "esc":
		msg = tea.KeyMsg{Type: tea.KeyEsc}
	case "tab":
		msg = tea.KeyMsg{Type: tea.KeyTab}
	case "down":
		msg = tea.KeyMsg{Type: tea.KeyDown}
	default:
		msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
	}
	_, cmd := m.Update(msg)
	return cmd
}

// A tool call and its result are one line; streamed text is one line,
// replaced by the authoritative copy.
func TestFeedCoalesces(t *testing.T) {
	f := newFeed()
	done := schemas.ToolCompleted
	for _, ev := range []schemas.Event{
		{Turn: 1, Payload: schemas.TurnStarted{}},
		{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("Look")}},
		{Turn: 1, Payload: schemas.AssistantText{Delta: true, Content: schemas.Text("ing.")}},
		{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("Looking.")}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash", RawInput: []byte(`{"command":"ls"}`)}}},
		{Turn: 1, Payload: schemas.ToolUse{Call: schemas.ToolCall{ToolCallID: "c1", Title: "Bash", RawInput: []byte(`{"command":"ls -la"}`)}}},
		{Turn: 1, Payload: schemas.ToolResult{Update: schemas.ToolCallUpdate{ToolCallID: "c1", Status: &done, Content: []schemas.ToolCallContent{schemas.ToolText("a.txt\nb.txt")}}}},
		{Turn: 1, Payload: schemas.Result{StopReason: schemas.StopEndTurn}},
	} {
		f.add(ev, time.Now())
	}
	var got []string
	for i := range f.lines {
		got = append(got, f.text(i))
	}
	want := []string{"── turn 1 ──", "Looking.", "▶ Bash ls -la → completed: a.txt b.txt", "── turn 1 ended: end_turn ──"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("feed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The filter narrows the list; x dismisses a dead agent at once and asks
// before closing a live one; g and n switch the layout.
func TestKeys(t *testing.T) {
	m, src := newTestModel(t,
		schemas.AgentRecord{ID: "alive", Node: "n1", Status: schemas.StatusIdle, Model: "sonnet"},
		schemas.AgentRecord{ID: "gone", Node: "n2", Status: schemas.StatusDead, Model: "acp:gemini"},
	)
	if v := m.View(); !strings.Contains(v, "alive") || !strings.Contains(v, "gone") {
		t.Fatalf("the list:\n%s", v)
	}
	key(m, "/")
	for _, r := range "gemini" {
		key(m, string(r))
	}
	key(m, "enter")
	if s := m.shown(); len(s) != 1 || s[0].ID != "gone" {
		t.Fatalf("filtered %+v", s)
	}
	key(m, "x")
	if len(m.shown()) != 0 || m.overlay != noOverlay {
		t.Fatalf("x on a dead agent: shown %d, overlay %d", len(m.shown()), m.overlay)
	}
	key(m, "/")
	key(m, "esc")
	if s := m.shown(); len(s) != 1 || s[0].ID != "alive" {
		t.Fatalf("after clearing the filter: %+v", s)
	}
	key(m, "x")
	if !strings.Contains(m.View(), "Close agent alive") {
		t.Fatal("x on a live agent did not ask")
	}
	key(m, "n")
	if m.overlay != noOverlay || len(src.closed) != 0 {
		t.Fatalf("any key but y keeps the agent: closed %v", src.closed)
	}
	key(m, "x")
	cmd := key(m, "y")
	if cmd == nil {
		t.Fatal("y closed nothing")
	}
	m.Update(cmd())
	if len(src.closed) != 1 || src.closed[0] != "alive" {
		t.Fatalf("closed %v", src.closed)
	}
	key(m, "n")
	if !strings.Contains(m.View(), "no nodes") {
		t.Fatalf("nodes view:\n%s", m.View())
	}
}

// A working agent pulses, and turns amber when it has been silent for
// longer than Options.Silent.
func TestSilentAgentTurnsAmber(t *testing.T) {
	m, _ := newTestModel(t, schemas.AgentRecord{ID: "busy", Node: "n1", Status: schemas.StatusWorking})
	m.Update(eventsMsg{{agent: "busy", ev: schemas.Event{Turn: 1, Payload: schemas.TurnStarted{}}, at: time.Now()}})
	a := m.shown()[0]
	m.Update(tickMsg(time.Now()))
	first := m.color(a)
	m.Update(tickMsg(time.Now()))
	if second := m.color(a); first == second {
		t.Fatalf("a working agent does not pulse: %v %v", first, second)
	}
	m.Update(tickMsg(time.Now().Add(time.Minute)))
	if c := m.color(a); c != amber {
		t.Fatalf("a silent agent is %v, want amber", c)
	}
}

// A click on a row selects that agent.
func TestMouseSelects(t *testing.T) {
	m, _ := newTestModel(t,
		schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle},
		schemas.AgentRecord{ID: "a2", Node: "n1", Status: schemas.StatusIdle},
	)
	m.View()
	// Row 0 is the header, row 1 node n1, rows 2 and 3 the agents.
	m.Update(tea.MouseMsg{X: 3, Y: 3, Button: tea.MouseButtonLeft, Action: tea.MouseActionPress})
	if a, _ := m.selected(); a.ID != "a2" {
		t.Fatalf("selected %s", a.ID)
	}
}
