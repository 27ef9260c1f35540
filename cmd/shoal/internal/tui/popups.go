package tui

import (
	"fmt"
	"strings"

	"charm.land/lipgloss/v2"
)

// popupWidth is the width of a popup's box; popupInner of its text.
func (m *Model) popupWidth() int { return max(20, m.width-8) }
func (m *Model) popupInner() int { return m.popupWidth() - 4 }

// popupRows is how many lines of text a popup shows.
func (m *Model) popupRows() int { return max(1, m.height-6) }

// box draws a popup: a title, lines that fit its width, a line of keys.
func (m *Model) box(title string, lines []string, keys string) string {
	if keys == "" {
		keys = "esc closes"
	}
	for i, l := range lines {
		lines[i] = clip(l, m.popupInner())
	}
	box := styleBox.Width(m.popupWidth()).Render(styleTitle.Render(title) + "\n" + strings.Join(lines, "\n") + "\n" + styleDim.Render(clip(keys, m.popupInner())))
	return lipgloss.Place(m.width, m.height, lipgloss.Center, lipgloss.Center, box)
}

// wrapped wraps lines to the popup's width.
func (m *Model) wrapped(lines []string) []string {
	var out []string
	for _, l := range lines {
		out = append(out, wrapText(l, m.popupInner())...)
	}
	return out
}

// scroller is a popup of text that scrolls: an event in full, the keys.
type scroller struct {
	title string
	text  []string
	top   int
}

func (s *scroller) view(m *Model) string {
	lines := m.wrapped(s.text)
	shown, keys := window(lines, &s.top, m.popupRows())
	return m.box(s.title, shown, keys+"esc closes")
}

// key scrolls; false means the popup closes.
func (s *scroller) key(k string, rows int) bool {
	switch k {
	case "up", "k":
		s.top = max(0, s.top-1)
	case "down", "j":
		s.top++
	case "pgup":
		s.top = max(0, s.top-rows)
	case "pgdown", "space":
		s.top += rows
	case "home", "g":
		s.top = 0
	default:
		return false
	}
	return true
}

// window is the part of lines a popup of rows shows from *top, kept in
// range, and the keys that scroll it when it does not all fit.
func window(lines []string, top *int, rows int) ([]string, string) {
	if len(lines) <= rows {
		*top = 0
		return lines, ""
	}
	*top = max(0, min(*top, len(lines)-rows))
	end := *top + rows
	return append([]string(nil), lines[*top:end]...), fmt.Sprintf("lines %d–%d of %d · ↑/↓ PgUp/PgDn · ", *top+1, end, len(lines))
}

func (m *Model) formView() string {
	f := m.form
	var lines []string
	for _, ti := range f.fields {
		ti.SetWidth(m.popupInner() - len(ti.Prompt) - 1)
		lines = append(lines, ti.View())
	}
	keys := "enter sends · esc cancels"
	if len(f.fields) > 1 {
		keys = "tab next field · enter opens · esc cancels"
	}
	return m.box(f.title, lines, keys)
}

func (m *Model) permitView() string {
	i, ok := m.permitShown()
	if !ok {
		return m.box("permission request", []string{"answered"}, "")
	}
	rs := m.permits[m.permit.agent]
	r := rs[i]
	rows := m.popupRows()
	if m.permit.message != nil {
		rows -= 2
	}
	shown, scroll := window(m.wrapped(m.permitLines(r, i, len(rs))), &m.permit.top, rows)
	keys := scroll + permitKeys(r, len(rs))
	if v := m.permit.message; v != nil {
		v.SetWidth(m.popupInner() - len(v.Prompt) - 1)
		shown = append(shown, "", v.View())
		keys = "enter denies · esc back"
	}
	return m.box("permission request: "+r.Tool, shown, keys)
}

func (m *Model) transcriptView() string {
	t := m.tr
	h := m.bodyHeight()
	t.settle(m.width, h)
	end := min(len(t.lines), t.top+h)
	body := make([]string, 0, h)
	for _, vl := range t.lines[t.top:end] {
		mark := "  "
		if vl.first {
			e := t.entries[vl.entry]
			sel, fold := " ", " "
			if vl.entry == t.sel {
				sel = "›"
			}
			if len(e.detail) > 0 {
				fold = "+"
				if e.expanded {
					fold = "−"
				}
			}
			mark = sel + fold
		}
		text := clip(vl.text, m.width-gutter)
		text = styleKind(t.entries[vl.entry].kind, text)
		if vl.entry == t.sel {
			mark = styleSelected.Render(mark)
		}
		body = append(body, mark+text)
	}
	if len(t.lines) == 0 && !t.loading {
		body = append(body, styleDim.Render("(no events stored)"))
	}
	for len(body) < h {
		body = append(body, "")
	}
	where := "following"
	if !t.follow {
		where = "scrolled · End follows"
	}
	if t.loading {
		where = "reading the stream…"
	}
	head := fmt.Sprintf("transcript of %s · lines %d–%d of %d · %s", t.agent, min(t.top+1, end), end, len(t.lines), where)
	keys := "↑/↓ entries · PgUp/PgDn · enter expands a tool · g/G top/bottom · esc closes"
	if m.feedLost != "" {
		keys = m.feedLost
	}
	return clip(styleTitle.Render(head), m.width) + "\n" + strings.Join(body, "\n") + "\n" + styleDim.Render(clip(keys, m.width))
}
