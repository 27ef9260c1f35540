package tui

import (
	"errors"

	tea "charm.land/bubbletea/v2"
)

// key handles a key: the filter's or a popup's first, when one is open.
// Keys that arrive together (key repeat, a slow link) come one by one:
// Bubble Tea reads each key of a burst as a message of its own.
func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	if k.String() == "ctrl+c" {
		return tea.Quit
	}
	if m.filtering {
		switch k.String() {
		case "enter", "esc":
			m.filtering = false
			m.filter.Blur()
			if k.String() == "esc" {
				m.filter.SetValue("")
			}
			m.clamp()
			return m.backfill()
		}
		var cmd tea.Cmd
		m.filter, cmd = m.filter.Update(k)
		m.sel = 0
		return cmd
	}
	switch m.overlay {
	case confirmOverlay:
		c := m.confirm
		m.overlay, m.confirm = noOverlay, nil
		if k.String() == "y" {
			return c.yes()
		}
		m.say(c.no, nil)
		return nil
	case formOverlay:
		cmd, done := m.form.key(k)
		if done {
			m.overlay, m.form = noOverlay, nil
			if k.String() == "esc" {
				m.say("cancelled", nil)
			}
		}
		return cmd
	case permitOverlay:
		return m.permitKey(k)
	case detailOverlay, helpOverlay:
		if !m.detail.key(k.String(), m.popupRows()) {
			m.overlay, m.detail = noOverlay, nil
		}
		return nil
	case transcriptOverlay:
		return m.transcriptKey(k)
	}
	a, ok := m.selected()
	switch k.String() {
	case "q":
		return tea.Quit
	case "?":
		m.detail = &scroller{title: "keys", text: splitLines(helpText)}
		m.overlay = helpOverlay
	case "esc":
		m.feedFocus = false
		m.fv = feedView{follow: true}
	case "tab":
		m.feedFocus = !m.feedFocus && !m.nodesView
		m.fv = feedView{follow: true}
	case "n":
		m.nodesView = !m.nodesView
		m.feedFocus = false
	case "g":
		m.byNode = !m.byNode
		cur := m.keepCurrent()
		m.sort()
		for i, s := range m.shown() {
			if s.ID == cur {
				m.sel = i
			}
		}
	case "/":
		m.filtering = true
		m.feedFocus = false
		return m.filter.Focus()
	case "up", "k":
		return m.move(-1)
	case "down", "j":
		return m.move(1)
	case "pgup":
		return m.move(-max(1, m.feedRows()-1))
	case "pgdown":
		return m.move(max(1, m.feedRows()-1))
	case "end", "G":
		if m.feedFocus {
			m.fv = feedView{follow: true}
		}
	case "home":
		if m.feedFocus {
			m.fv = feedView{sel: -1 << 31}
		}
	case "enter":
		if !m.feedFocus {
			m.feedFocus, m.fv = true, feedView{follow: true}
			return nil
		}
		if l, ok := m.fv.selectedLine(m.feeds[a.ID]); ok {
			m.detail = &scroller{title: "event", text: splitLines(eventDetail(l))}
			m.overlay = detailOverlay
		}
	case "o":
		if m.opts.Observer {
			return m.watchOnly()
		}
		return m.openAgentForm()
	}
	if !ok || m.nodesView {
		return nil
	}
	if m.opts.Observer {
		switch k.String() {
		case "x", "i", "s", "m", "p":
			return m.watchOnly()
		}
	}
	switch k.String() {
	case "t":
		m.tr = newTranscript(a.ID)
		m.overlay = transcriptOverlay
		return m.history(a.ID, true)
	case "x":
		return m.askClose(a)
	case "i":
		m.askInterrupt(a)
	case "s":
		return m.sendForm(a)
	case "m":
		return m.modelForm(a)
	case "p":
		return m.openPermit(a)
	}
	return nil
}

// paste takes pasted text (a bracketed paste, which Bubble Tea reads as
// one message) into the field that has the keyboard: the filter, a
// form's field, a permission's message. A paste is never keys: with no
// field open it does nothing.
func (m *Model) paste(p tea.PasteMsg) tea.Cmd {
	var cmd tea.Cmd
	switch {
	case m.filtering:
		m.filter, cmd = m.filter.Update(p)
		m.sel = 0
	case m.overlay == formOverlay:
		f := m.form
		f.fields[f.focus], cmd = f.fields[f.focus].Update(p)
	case m.overlay == permitOverlay && m.permit.message != nil:
		*m.permit.message, cmd = m.permit.message.Update(p)
	}
	return cmd
}

// move moves the cursor of the list, or the feed's selection.
func (m *Model) move(d int) tea.Cmd {
	if m.feedFocus {
		if a, ok := m.selected(); ok && m.feeds[a.ID] != nil {
			m.fv.move(m.feeds[a.ID], d)
		}
		return nil
	}
	m.moveSel(d)
	return m.backfill()
}

func (m *Model) transcriptKey(k tea.KeyPressMsg) tea.Cmd {
	t, h := m.tr, m.bodyHeight()
	t.settle(m.width, h)
	switch k.String() {
	case "esc", "q", "t":
		m.overlay, m.tr = noOverlay, nil
	case "up", "k":
		t.up(h)
	case "down", "j":
		t.down(h)
	case "pgup":
		t.scroll(-h, h)
	case "pgdown", "space":
		t.scroll(h, h)
	case "home", "g":
		t.follow, t.top, t.sel = false, 0, 0
	case "end", "G":
		t.follow = true
	case "enter":
		if t.toggle() {
			t.settle(m.width, h)
			t.reveal(h)
		}
	}
	return nil
}

// mouse: the wheel moves the selection or scrolls, a click on a row
// selects it.
func (m *Model) mouse(msg tea.MouseMsg) tea.Cmd {
	e := msg.Mouse()
	wheel := 0
	switch msg.(type) {
	case tea.MouseWheelMsg:
		switch e.Button {
		case tea.MouseWheelUp:
			wheel = -1
		case tea.MouseWheelDown:
			wheel = 1
		default:
			return nil
		}
	case tea.MouseClickMsg:
	default:
		return nil
	}
	switch m.overlay {
	case transcriptOverlay:
		h := m.bodyHeight()
		m.tr.settle(m.width, h)
		switch {
		case wheel != 0:
			m.tr.scroll(3*wheel, h)
		case e.Button == tea.MouseLeft:
			m.tr.at(e.Y - 1)
		}
		return nil
	case detailOverlay, helpOverlay:
		if wheel != 0 {
			m.detail.top = max(0, m.detail.top+3*wheel)
		}
		return nil
	case permitOverlay:
		if wheel != 0 {
			m.permit.top = max(0, m.permit.top+3*wheel)
		}
		return nil
	case noOverlay:
	default:
		return nil
	}
	if m.nodesView {
		return nil
	}
	if wheel != 0 {
		if e.X >= m.listWidth() {
			if a, ok := m.selected(); ok && m.feeds[a.ID] != nil {
				m.feedFocus = true
				m.fv.move(m.feeds[a.ID], wheel)
			}
			return nil
		}
		m.feedFocus = false
		return m.move(wheel)
	}
	if e.Button != tea.MouseLeft {
		return nil
	}
	if e.X < m.listWidth() {
		if i, ok := m.rowAt(e.Y); ok {
			if i != m.sel {
				m.fv = feedView{follow: true}
			}
			m.sel, m.feedFocus = i, false
			return m.backfill()
		}
		return nil
	}
	m.feedFocus = true
	return nil
}

// watchOnly says, at once, that an observer's monitor acts on nothing.
func (m *Model) watchOnly() tea.Cmd {
	m.say("", errors.New("this monitor only watches (observer credentials): it opens, sends, interrupts, answers and closes nothing"))
	return nil
}
