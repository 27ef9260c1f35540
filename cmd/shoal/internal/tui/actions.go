package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/schemas"
)

// confirm asks before an action that ends something.
type confirm struct {
	title, text string
	keys        string // what y does, and any other key
	yes         func() tea.Cmd
	no          string // the status when the answer is no
}

// form is a popup of text fields: enter submits, esc cancels, tab moves.
type form struct {
	title  string
	labels []string
	fields []textinput.Model
	focus  int
	submit func(values []string) tea.Cmd
}

func newForm(title string, submit func([]string) tea.Cmd, fields ...[2]string) *form {
	f := &form{title: title, submit: submit}
	width := 0
	for _, fl := range fields {
		width = max(width, len(fl[0]))
	}
	for _, fl := range fields {
		ti := textinput.New()
		ti.Prompt = fmt.Sprintf("%-*s ", width, fl[0])
		ti.SetValue(fl[1])
		ti.CursorEnd()
		f.labels = append(f.labels, fl[0])
		f.fields = append(f.fields, ti)
	}
	f.fields[0].Focus()
	return f
}

func (f *form) values() []string {
	out := make([]string, len(f.fields))
	for i, ti := range f.fields {
		out[i] = strings.TrimSpace(ti.Value())
	}
	return out
}

// key handles a key; done says the form is over.
func (f *form) key(k tea.KeyPressMsg) (cmd tea.Cmd, done bool) {
	switch k.String() {
	case "esc":
		return nil, true
	case "enter":
		return f.submit(f.values()), true
	case "tab", "down", "shift+tab", "up":
		f.fields[f.focus].Blur()
		d := 1
		if s := k.String(); s == "shift+tab" || s == "up" {
			d = len(f.fields) - 1
		}
		f.focus = (f.focus + d) % len(f.fields)
		return f.fields[f.focus].Focus(), false
	}
	f.fields[f.focus], cmd = f.fields[f.focus].Update(k)
	return cmd, false
}

func (m *Model) ask(c confirm) {
	m.confirm, m.overlay = &c, confirmOverlay
}

func (m *Model) openForm(f *form) tea.Cmd {
	m.form, m.overlay = f, formOverlay
	return textinput.Blink
}

// live says whether a is an agent actions can reach, and says why not.
func (m *Model) live(a schemas.AgentRecord) bool {
	if a.Status == schemas.StatusDead || a.Status == schemas.StatusClosed {
		m.say(fmt.Sprintf("%s is %s", a.ID, a.Status), nil)
		return false
	}
	return true
}

// act runs a request against the fabric and reports its outcome.
func (m *Model) act(doing string, do func() doneMsg) tea.Cmd {
	m.say(doing+"…", nil)
	return func() tea.Msg { return do() }
}

// askInterrupt asks before interrupting the selected agent's turn.
func (m *Model) askInterrupt(a schemas.AgentRecord) {
	if !m.live(a) {
		return
	}
	if a.Status != schemas.StatusWorking && a.Status != schemas.StatusStarting {
		m.say(fmt.Sprintf("%s is %s: no turn to interrupt", a.ID, a.Status), nil)
		return
	}
	m.ask(confirm{
		title: "interrupt",
		text:  fmt.Sprintf("Interrupt agent %s's turn %d? It ends now, and so do the turns held behind it.", a.ID, a.Turn),
		keys:  "y interrupts · any other key lets it run",
		no:    a.ID + "'s turn goes on",
		yes: func() tea.Cmd {
			return m.act("interrupting "+a.ID, func() doneMsg {
				rep, err := m.src.Interrupt(m.ctx, schemas.AgentRequest{AgentID: a.ID})
				switch {
				case err != nil:
					return doneMsg{err: fmt.Errorf("interrupting %s: %w", a.ID, err)}
				case !rep.Interrupted:
					return doneMsg{text: a.ID + " had no turn running"}
				}
				return doneMsg{text: "interrupted " + a.ID + "'s turn"}
			})
		},
	})
}

// askClose asks before closing the selected agent; a dead one is
// dismissed from the list at once.
func (m *Model) askClose(a schemas.AgentRecord) tea.Cmd {
	if a.Status == schemas.StatusDead {
		m.dismissed[a.ID] = true
		m.say("dismissed "+a.ID, nil)
		m.clamp()
		return m.backfill()
	}
	m.ask(confirm{
		title: "close",
		text:  fmt.Sprintf("Close agent %s on %s? It stops and everything it started.", a.ID, a.Node),
		keys:  "y closes · any other key keeps it",
		no:    "nothing closed",
		yes: func() tea.Cmd {
			return m.act("closing "+a.ID, func() doneMsg {
				rep, err := m.src.Close(m.ctx, schemas.AgentRequest{AgentID: a.ID})
				switch {
				case err != nil:
					return doneMsg{err: fmt.Errorf("closing %s: %w", a.ID, err)}
				case !rep.Closed:
					return doneMsg{text: a.ID + " was not running"}
				}
				return doneMsg{text: "closed " + a.ID}
			})
		},
	})
	return nil
}

// sendForm asks for a turn to send to the selected agent.
func (m *Model) sendForm(a schemas.AgentRecord) tea.Cmd {
	if !m.live(a) {
		return nil
	}
	return m.openForm(newForm("send a turn to "+a.ID, func(v []string) tea.Cmd {
		if v[0] == "" {
			m.say("nothing sent", nil)
			return nil
		}
		return m.act("sending to "+a.ID, func() doneMsg {
			rep, err := m.src.Send(m.ctx, schemas.SendRequest{AgentID: a.ID, Text: v[0]})
			if err != nil {
				return doneMsg{err: fmt.Errorf("sending to %s: %w", a.ID, err)}
			}
			return doneMsg{text: fmt.Sprintf("sent turn %d to %s", rep.Turn, a.ID)}
		})
	}, [2]string{"text", ""}))
}

// modelForm asks for the model to point the selected agent at.
func (m *Model) modelForm(a schemas.AgentRecord) tea.Cmd {
	if !m.live(a) {
		return nil
	}
	return m.openForm(newForm("set the model of "+a.ID, func(v []string) tea.Cmd {
		if v[0] == "" || v[0] == a.Model {
			m.say(a.ID+" keeps "+a.Model, nil)
			return nil
		}
		return m.act("switching "+a.ID+" to "+v[0], func() doneMsg {
			rep, err := m.src.SetModel(m.ctx, schemas.SetModelRequest{AgentID: a.ID, Model: v[0]})
			switch {
			case err != nil:
				return doneMsg{err: fmt.Errorf("setting the model of %s: %w", a.ID, err)}
			case !rep.Switched && rep.Reason != "":
				return doneMsg{err: fmt.Errorf("%s did not switch: %s", a.ID, rep.Reason)}
			case !rep.Switched:
				return doneMsg{err: fmt.Errorf("%s did not switch to %s", a.ID, v[0])}
			}
			return doneMsg{text: a.ID + " switched to " + v[0]}
		})
	}, [2]string{"model", a.Model}))
}

// openAgentForm asks where and how to open an agent; its fields start as
// the selected agent's.
func (m *Model) openAgentForm() tea.Cmd {
	cwd, model, preset := m.opts.Dir, schemas.DefaultModel, string(schemas.PresetDefault)
	if a, ok := m.selected(); ok {
		cwd, model = a.CWD, a.Model
		if a.Policy != nil && a.Policy.Preset != "" {
			preset = string(a.Policy.Preset)
		}
	}
	return m.openForm(newForm("open an agent", func(v []string) tea.Cmd {
		if v[0] == "" {
			m.say("nothing opened: an agent needs a directory", nil)
			return nil
		}
		req := schemas.OpenRequest{CWD: v[0], Model: v[1], Permission: v[2]}
		return m.act("opening an agent in "+v[0], func() doneMsg {
			rep, err := m.src.Open(m.ctx, req)
			if err != nil {
				return doneMsg{err: fmt.Errorf("opening an agent: %w", err)}
			}
			return doneMsg{text: fmt.Sprintf("opened %s on %s", rep.AgentID, rep.Node), open: rep.AgentID}
		})
	}, [2]string{"directory", cwd}, [2]string{"model", model}, [2]string{"preset", preset}))
}
