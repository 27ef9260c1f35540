package tui

import (
	"reflect"
	"testing"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/shoalfabric/shoal/schemas"
)

// Keys that arrive together (key repeat, a slow link) come as one key of
// several runes: each acts in turn, as if read one by one. Typed into a
// field they are text; pasted, they are no keys at all.
func TestKeysArrivingTogether(t *testing.T) {
	m, src := newTestModel(t,
		schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 1},
		schemas.AgentRecord{ID: "a2", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 2},
		schemas.AgentRecord{ID: "a3", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 3},
		schemas.AgentRecord{ID: "a4", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 4},
	)
	first, _ := m.selected()
	key(m, "jjj")
	if m.sel != 3 {
		t.Fatalf("after jjj the cursor is on row %d, want 3", m.sel)
	}
	key(m, "kk")
	if m.sel != 1 {
		t.Fatalf("after kk the cursor is on row %d, want 1", m.sel)
	}
	// A paste is not keys.
	m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("jj"), Paste: true})
	if m.sel != 1 {
		t.Fatalf("a pasted jj moved the cursor to row %d", m.sel)
	}
	// A confirm answered yy: the first y answers it.
	a, _ := m.selected()
	key(m, "x")
	press(m, "yy")
	if got := src.took(); !reflect.DeepEqual(got, []any{schemas.AgentRequest{AgentID: a.ID}}) {
		t.Fatalf("x then yy asked the fabric %v, want %s closed", got, a.ID)
	}
	// A filter opened in the burst takes the rest as its text.
	key(m, "/a4")
	if m.filter.Value() != "a4" {
		t.Fatalf("the filter holds %q after /a4", m.filter.Value())
	}
	key(m, "enter")
	key(m, "/")
	key(m, "esc")
	// Text typed into a form stays text.
	for m.sel > 0 {
		key(m, "k")
	}
	if a, _ := m.selected(); a.ID != first.ID {
		t.Fatalf("back at the top, the cursor is on %s", a.ID)
	}
	key(m, "s")
	key(m, "jjq")
	press(m, "enter")
	if got := src.took(); !reflect.DeepEqual(got, []any{schemas.SendRequest{AgentID: first.ID, Text: "jjq"}}) {
		t.Fatalf("typing jjq into the send form asked the fabric %v", got)
	}
}
