package tui

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/schemas"
)

// permitView is the permission overlay: one of the selected agent's
// open requests in full, answered from there.
type permitView struct {
	agent   string
	request string // the request shown
	top     int    // the first line shown
	// message is the denial's message while it is typed.
	message *textinput.Model
}

// setPending takes the open permission requests. When the fabric serves
// none, it stops asking.
func (m *Model) setPending(msg pendingMsg) tea.Cmd {
	var next tea.Cmd
	if !msg.once {
		next = m.readPending(m.opts.Poll)
	}
	switch {
	case errors.Is(msg.err, ErrNoPermits):
		m.permitsOff, m.permits, m.permitsOmitted = msg.err, map[string][]schemas.PermitRecord{}, 0
		if m.overlay == permitOverlay {
			m.overlay, m.permit = noOverlay, nil
		}
		return nil
	case msg.err != nil:
		m.pendingErr = msg.err
		return next // what was listed stands until a read succeeds
	}
	m.permitsOff, m.pendingErr = nil, nil
	by := map[string][]schemas.PermitRecord{}
	m.permitsOmitted = msg.Omitted
	for _, r := range msg.Requests {
		if r.Answer == nil {
			by[r.AgentID] = append(by[r.AgentID], r)
		}
	}
	for _, rs := range by {
		slices.SortFunc(rs, func(a, b schemas.PermitRecord) int {
			if a.AskedAt != b.AskedAt {
				if a.AskedAt < b.AskedAt {
					return -1
				}
				return 1
			}
			return strings.Compare(a.RequestID, b.RequestID)
		})
	}
	m.permits = by
	if v := m.permit; v != nil && m.overlay == permitOverlay {
		if _, ok := m.permitShown(); !ok {
			if rs := by[v.agent]; len(rs) > 0 {
				v.request, v.top, v.message = rs[0].RequestID, 0, nil
			} else {
				m.overlay, m.permit = noOverlay, nil
				m.say("the permission request was answered elsewhere", nil)
			}
		}
	}
	return next
}

// dropPermit forgets a request once answered, before the next read.
func (m *Model) dropPermit(r schemas.PermitRecord) {
	m.permits[r.AgentID] = slices.DeleteFunc(m.permits[r.AgentID], func(p schemas.PermitRecord) bool { return p.RequestID == r.RequestID })
}

// openPermit shows the selected agent's first open request.
func (m *Model) openPermit(a schemas.AgentRecord) tea.Cmd {
	if m.permitsOff != nil {
		m.say("permission requests are unavailable: "+ErrNoPermits.Error(), nil)
		return nil
	}
	rs := m.permits[a.ID]
	if len(rs) == 0 {
		if m.pendingErr != nil {
			m.say("", fmt.Errorf("no permission request known for %s: reading them failed: %w", a.ID, m.pendingErr))
			return nil
		}
		m.say("no permission request waiting for "+a.ID, nil)
		return nil
	}
	m.permit = &permitView{agent: a.ID, request: rs[0].RequestID}
	m.overlay = permitOverlay
	return nil
}

// permitShown is the request the overlay shows and its place among the
// agent's.
func (m *Model) permitShown() (int, bool) {
	if m.permit == nil {
		return 0, false
	}
	for i, r := range m.permits[m.permit.agent] {
		if r.RequestID == m.permit.request {
			return i, true
		}
	}
	return 0, false
}

// permitKey handles a key in the permission overlay.
func (m *Model) permitKey(k tea.KeyPressMsg) tea.Cmd {
	v := m.permit
	i, ok := m.permitShown()
	if !ok {
		m.overlay, m.permit = noOverlay, nil
		return nil
	}
	rs := m.permits[v.agent]
	r := rs[i]
	if v.message != nil {
		switch k.String() {
		case "esc":
			v.message = nil
			return nil
		case "enter":
			text := strings.TrimSpace(v.message.Value())
			return m.answer(r, schemas.DecisionDeny, "", text)
		}
		var cmd tea.Cmd
		*v.message, cmd = v.message.Update(k)
		return cmd
	}
	rows := m.popupRows()
	switch s := k.String(); s {
	case "esc", "q", "p":
		m.overlay, m.permit = noOverlay, nil
	case "a", "y":
		return m.answer(r, schemas.DecisionAllow, "", "")
	case "d", "n":
		ti := textinput.New()
		ti.Prompt = "message to the agent (optional) > "
		ti.Focus()
		v.message = &ti
		return textinput.Blink
	case "right", "l", "tab":
		v.request, v.top = rs[(i+1)%len(rs)].RequestID, 0
	case "left", "h", "shift+tab":
		v.request, v.top = rs[(i+len(rs)-1)%len(rs)].RequestID, 0
	case "up", "k":
		v.top = max(0, v.top-1)
	case "down", "j":
		v.top++
	case "pgup":
		v.top = max(0, v.top-rows)
	case "pgdown", "space":
		v.top += rows
	default:
		if len(s) == 1 && s[0] >= '1' && s[0] <= '9' {
			n := int(s[0] - '1')
			if n >= len(r.Options) {
				m.say(fmt.Sprintf("the request offers %d options", len(r.Options)), nil)
				return nil
			}
			o := r.Options[n]
			d := schemas.DecisionAllow
			if o.Kind == schemas.PermissionRejectOnce || o.Kind == schemas.PermissionRejectAlways {
				d = schemas.DecisionDeny
			}
			return m.answer(r, d, o.OptionID, "")
		}
	}
	return nil
}

// answer sends a person's answer to a permission request.
func (m *Model) answer(r schemas.PermitRecord, d schemas.Decision, option, message string) tea.Cmd {
	m.overlay, m.permit = noOverlay, nil
	req := schemas.PermitRequest{AgentID: r.AgentID, RequestID: r.RequestID, Decision: d, Option: option, Message: message, By: "tui"}
	return m.act(fmt.Sprintf("answering %s's request for %s", r.AgentID, r.Tool), func() doneMsg {
		if _, err := m.src.Permit(m.ctx, req); err != nil {
			return doneMsg{err: fmt.Errorf("answering %s's request for %s: %w", r.AgentID, r.Tool, err)}
		}
		verb := map[schemas.Decision]string{schemas.DecisionAllow: "allowed", schemas.DecisionDeny: "denied"}[d]
		text := fmt.Sprintf("%s %s for %s", verb, r.Tool, r.AgentID)
		if option != "" {
			text += " (" + option + ")"
		}
		return doneMsg{text: text, answered: &r}
	})
}

// permitLines are the lines of a request in full.
func (m *Model) permitLines(r schemas.PermitRecord, i, n int) []string {
	asked := "—"
	if r.AskedAt > 0 {
		asked = m.now.Sub(floatTime(r.AskedAt)).Round(time.Second).String() + " ago"
	}
	out := []string{
		fmt.Sprintf("request %d of %d · agent %s · node %s · id %s", i+1, n, r.AgentID, r.Node, r.RequestID),
		"",
	}
	out = append(out, labelled("tool", r.Tool)...)
	out = append(out, "asked        "+asked)
	if r.Deadline > 0 {
		left := floatTime(r.Deadline).Sub(m.now).Round(time.Second)
		if left > 0 {
			out = append(out, fmt.Sprintf("deadline     denied in %s without an answer", left))
		} else {
			out = append(out, "deadline     passed")
		}
	}
	if r.ToolCallID != "" {
		out = append(out, "tool call    "+r.ToolCallID)
	}
	if r.Description != "" {
		out = append(out, labelled("description", r.Description)...)
	}
	out = append(out, "", "input")
	if len(r.Input) == 0 {
		out = append(out, "  (none)")
	}
	for _, l := range prettyJSON(r.Input) {
		if len(r.Input) > 0 {
			out = append(out, "  "+l)
		}
	}
	out = append(out, "", "options")
	if len(r.Options) == 0 {
		out = append(out, "  none offered: a allows, d denies")
	}
	for j, o := range r.Options {
		out = append(out, fmt.Sprintf("  %d  %-20s %s", j+1, o.Name, o.Kind))
	}
	return out
}

// labelled is a field of a request under its label, its lines after the
// first indented under the first: what an agent says (gemini names a
// shell call by its command) may hold lines that would otherwise read as
// the overlay's own.
func labelled(label, value string) []string {
	lines := strings.Split(strings.TrimRight(value, "\n"), "\n")
	out := []string{fmt.Sprintf("%-13s%s", label, lines[0])}
	for _, l := range lines[1:] {
		out = append(out, strings.Repeat(" ", 13)+"│ "+l)
	}
	return out
}

// permitKeys is the overlay's line of keys.
func permitKeys(r schemas.PermitRecord, n int) string {
	keys := "a allow · d deny (with a message)"
	if len(r.Options) > 0 {
		keys += fmt.Sprintf(" · 1–%d pick an option", len(r.Options))
	}
	if n > 1 {
		keys += " · ←/→ another request"
	}
	return keys + " · esc back"
}

// waiting is the marker of an agent with open requests, or "".
func (m *Model) waiting(id string) string {
	if n := len(m.permits[id]); n > 0 {
		return fmt.Sprintf("⚠ %d waiting", n)
	}
	return ""
}

func floatTime(s float64) time.Time { return time.Unix(0, int64(s*1e9)) }
