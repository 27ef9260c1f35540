package tui

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/schemas"
)

// noActions is the part of a Source that acts, refusing everything, for
// sources that only show.
type noActions struct{}

var errReadOnly = errors.New("this test's fabric only shows")

func (noActions) Open(context.Context, schemas.OpenRequest) (schemas.OpenReply, error) {
	return schemas.OpenReply{}, errReadOnly
}
func (noActions) Send(context.Context, schemas.SendRequest) (schemas.SendReply, error) {
	return schemas.SendReply{}, errReadOnly
}
func (noActions) Interrupt(context.Context, schemas.AgentRequest) (schemas.InterruptReply, error) {
	return schemas.InterruptReply{}, errReadOnly
}
func (noActions) SetModel(context.Context, schemas.SetModelRequest) (schemas.SetModelReply, error) {
	return schemas.SetModelReply{}, errReadOnly
}
func (noActions) Close(context.Context, schemas.AgentRequest) (schemas.CloseReply, error) {
	return schemas.CloseReply{}, errReadOnly
}
func (noActions) Pending(context.Context) (schemas.PendingReply, error) {
	return schemas.PendingReply{}, ErrNoPermits
}
func (noActions) Permit(context.Context, schemas.PermitRequest) (schemas.PermitReply, error) {
	return schemas.PermitReply{}, ErrNoPermits
}

// fakeSource is a fabric of fixed records that records every request
// made of it and answers as told.
type fakeSource struct {
	mu       sync.Mutex
	agents   []schemas.AgentRecord
	stored   map[string][]Event
	pending  []schemas.PermitRecord
	omitted  int // requests waiting that the reply leaves out
	setModel schemas.SetModelReply
	calls    []any
}

func (f *fakeSource) called(req any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req)
}

// took returns the requests made so far and forgets them.
func (f *fakeSource) took() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeSource) Agents(context.Context) ([]schemas.AgentRecord, error) { return f.agents, nil }
func (f *fakeSource) Nodes(context.Context) ([]schemas.NodeRecord, error)   { return nil, nil }
func (f *fakeSource) Follow(ctx context.Context, _ Resume, _ func(Event)) error {
	<-ctx.Done()
	return nil
}
func (f *fakeSource) History(_ context.Context, id string, _ int) ([]Event, error) {
	return f.stored[id], nil
}
func (f *fakeSource) Open(_ context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	f.called(req)
	return schemas.OpenReply{AgentID: "fresh", Node: "n1"}, nil
}
func (f *fakeSource) Send(_ context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	f.called(req)
	return schemas.SendReply{Turn: 3}, nil
}
func (f *fakeSource) Interrupt(_ context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	f.called(req)
	return schemas.InterruptReply{Interrupted: true}, nil
}
func (f *fakeSource) SetModel(_ context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	f.called(req)
	return f.setModel, nil
}
func (f *fakeSource) Close(_ context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	f.called(req)
	return schemas.CloseReply{Closed: true}, nil
}
func (f *fakeSource) Pending(context.Context) (schemas.PendingReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return schemas.PendingReply{Requests: f.pending, Omitted: f.omitted}, nil
}
func (f *fakeSource) Permit(_ context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	f.called(req)
	return schemas.PermitReply{}, nil
}

func newTestModel(t *testing.T, agents ...schemas.AgentRecord) (*Model, *fakeSource) {
	t.Helper()
	src := &fakeSource{agents: agents, stored: map[string][]Event{}}
	m := New(t.Context(), src, Options{Dir: "/home/me"})
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 30})
	m.Update(agentsMsg(agents))
	return m, src
}

// key presses k and returns the command the model gave back. A k of
// several characters is keys that arrive together (key repeat, a slow
// link), which Bubble Tea reads as one key each (TestKeysReadTogether).
func key(m *Model, k string) tea.Cmd {
	var msgs []tea.KeyPressMsg
	switch k {
	case "enter":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyEnter})
	case "esc":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyEscape})
	case "tab":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyTab})
	case "down":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyDown})
	case "up":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyUp})
	case "pgup":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyPgUp})
	case "end":
		msgs = append(msgs, tea.KeyPressMsg{Code: tea.KeyEnd})
	case "ctrl+u":
		msgs = append(msgs, tea.KeyPressMsg{Code: 'u', Mod: tea.ModCtrl})
	default:
		for _, r := range k {
			msgs = append(msgs, tea.KeyPressMsg{Code: r, Text: string(r)})
		}
	}
	var cmds []tea.Cmd
	for _, msg := range msgs {
		_, cmd := m.Update(msg)
		cmds = append(cmds, cmd)
	}
	return tea.Batch(cmds...)
}

// press presses k and runs what it starts, when that is a request to
// the fabric: its outcome goes back to the model.
func press(m *Model, k string) {
	run(m, key(m, k))
}

// run runs cmd and gives the model its message, when cmd is an action or
// a read of events (not a blink, not a poll that waits).
func run(m *Model, cmd tea.Cmd) {
	if cmd == nil {
		return
	}
	switch msg := cmd().(type) {
	case doneMsg, historyMsg, pendingMsg:
		_, next := m.Update(msg)
		if _, ok := msg.(doneMsg); ok {
			run(m, next) // an answer reads the requests again
		}
	}
}

// typeText types s into whatever has the keyboard.
func typeText(m *Model, s string) {
	for _, r := range s {
		key(m, string(r))
	}
}

// screenHas fails unless the screen shows every one of want.
func screenHas(t *testing.T, m *Model, want ...string) string {
	t.Helper()
	v := m.View().Content
	for _, w := range want {
		if !strings.Contains(v, w) {
			t.Fatalf("the screen does not show %q:\n%s", w, v)
		}
	}
	return v
}
