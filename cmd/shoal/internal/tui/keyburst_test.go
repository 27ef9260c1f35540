package tui

import (
	"io"
	"reflect"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"

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
	m.Update(tea.PasteMsg{Content: "jj"})
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

// Bubble Tea reads keys that arrive together (here in one read of the
// terminal) as one message each, and a bracketed paste as one paste,
// which is no key: the model sees j j j k k, then the paste, then q.
func TestKeysReadTogether(t *testing.T) {
	m, _ := newTestModel(t, schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 1})
	var got []string
	record := func(_ tea.Model, msg tea.Msg) tea.Msg {
		switch msg := msg.(type) {
		case tea.KeyPressMsg:
			got = append(got, "key "+msg.String())
		case tea.PasteMsg:
			got = append(got, "paste "+msg.Content)
		}
		return msg
	}
	in := strings.NewReader("jjjkk\x1b[200~jj q\x1b[201~q")
	p := tea.NewProgram(noInit{m}, tea.WithContext(t.Context()), tea.WithInput(in), tea.WithOutput(io.Discard),
		tea.WithoutSignalHandler(), tea.WithFilter(record))
	if _, err := p.Run(); err != nil {
		t.Fatal(err)
	}
	want := []string{"key j", "key j", "key j", "key k", "key k", "paste jj q", "key q"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the monitor read %q, want %q", got, want)
	}
}

// A paste goes into the field that has the keyboard, whole: the filter,
// a form's field. With no field open it is no keys.
func TestPasteIntoAField(t *testing.T) {
	m, src := newTestModel(t,
		schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 1},
		schemas.AgentRecord{ID: "a2", Node: "n1", Status: schemas.StatusIdle, CreatedAt: 2},
	)
	m.Update(tea.PasteMsg{Content: "jq"})
	if m.sel != 0 {
		t.Fatalf("a pasted jq moved the cursor to row %d", m.sel)
	}
	key(m, "/")
	m.Update(tea.PasteMsg{Content: "a2"})
	if m.filter.Value() != "a2" {
		t.Fatalf("the filter holds %q after a2 was pasted into it", m.filter.Value())
	}
	key(m, "esc")
	key(m, "s")
	typeText(m, "say ")
	m.Update(tea.PasteMsg{Content: "q then x"})
	press(m, "enter")
	if got := src.took(); !reflect.DeepEqual(got, []any{schemas.SendRequest{AgentID: "a1", Text: "say q then x"}}) {
		t.Fatalf("pasting into the send form asked the fabric %v", got)
	}
}

// noInit is a model started without its first reads and its clock: a
// program that runs only the keys it is given.
type noInit struct{ *Model }

func (noInit) Init() tea.Cmd { return nil }
