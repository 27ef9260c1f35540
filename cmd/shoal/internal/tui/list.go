package tui

import (
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// setAgents takes a fresh list. The order does not depend on status, so
// rows do not move under the cursor as agents start and end turns; the
// cursor stays on the agent it was on, or, when that one is gone, on the
// row where it was; an agent just opened takes the cursor once listed.
func (m *Model) setAgents(as []schemas.AgentRecord) {
	cur := m.keepCurrent()
	m.agents = as
	m.sort()
	shown := m.shown()
	at := func(id string) bool {
		for i, a := range shown {
			if a.ID == id {
				m.sel = i
				return true
			}
		}
		return false
	}
	if m.keep != "" && at(m.keep) {
		m.keep = ""
	} else {
		at(cur)
	}
	m.clamp()
	if m.keepCurrent() != cur {
		m.feedFocus, m.fv = false, feedView{follow: true}
	}
}

// keepCurrent is the id of the selected agent, or "".
func (m *Model) keepCurrent() string {
	if a, ok := m.selected(); ok {
		return a.ID
	}
	return ""
}

// sort orders the agents by node (when grouped), then by when they were
// created: an order that holds while their status changes.
func (m *Model) sort() {
	slices.SortStableFunc(m.agents, func(a, b schemas.AgentRecord) int {
		if m.byNode && a.Node != b.Node {
			return strings.Compare(a.Node, b.Node)
		}
		if a.CreatedAt != b.CreatedAt {
			if a.CreatedAt < b.CreatedAt {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// applyStatus follows an agent's status from its events between reads
// of the list.
func (m *Model) applyStatus(id string, ev schemas.Event) {
	i := slices.IndexFunc(m.agents, func(a schemas.AgentRecord) bool { return a.ID == id })
	if i < 0 {
		return
	}
	a := &m.agents[i]
	switch p := ev.Payload.(type) {
	case schemas.Status:
		a.Status = p.Status
	case schemas.TurnStarted:
		a.Turn, a.Status = ev.Turn, schemas.StatusWorking
	case schemas.Result:
		if p.Usage != nil {
			a.Usage.InputTokens += p.Usage.InputTokens
			a.Usage.OutputTokens += p.Usage.OutputTokens
		}
	}
}

// shown are the agents the list shows: not dismissed, matching the
// filter.
func (m *Model) shown() []schemas.AgentRecord {
	q := strings.ToLower(strings.TrimSpace(m.filter.Value()))
	var out []schemas.AgentRecord
	for _, a := range m.agents {
		if m.dismissed[a.ID] {
			continue
		}
		if q != "" && !strings.Contains(strings.ToLower(strings.Join([]string{a.ID, a.Node, string(a.Status), a.Model, a.CWD}, " ")), q) {
			continue
		}
		out = append(out, a)
	}
	return out
}

func (m *Model) selected() (schemas.AgentRecord, bool) {
	s := m.shown()
	if m.sel < 0 || m.sel >= len(s) {
		return schemas.AgentRecord{}, false
	}
	return s[m.sel], true
}

func (m *Model) clamp() {
	n := len(m.shown())
	m.sel = max(0, min(m.sel, n-1))
}

// entries are the agent list's lines before rendering: a node's header
// (agent -1) or an agent.
type entry struct {
	agent int
	node  string
}

func (m *Model) entries(shown []schemas.AgentRecord) []entry {
	var out []entry
	node := "\x00"
	for i, a := range shown {
		if m.byNode && a.Node != node {
			node = a.Node
			out = append(out, entry{agent: -1, node: node})
		}
		out = append(out, entry{agent: i})
	}
	return out
}

// top is the first entry the list shows, so that the selection is on
// screen; it moves only when the selection leaves the window.
func (m *Model) top(es []entry, h int) int {
	at := 0
	for i, e := range es {
		if e.agent == m.sel {
			at = i
		}
	}
	if at < m.listTop {
		m.listTop = max(0, at-1)
	}
	if at >= m.listTop+h {
		m.listTop = at - h + 1
	}
	m.listTop = max(0, min(m.listTop, len(es)-h))
	return m.listTop
}

// rowAt is the agent shown on screen row y.
func (m *Model) rowAt(y int) (int, bool) {
	es := m.entries(m.shown())
	i := m.listTop + y - 2 // below the title and the column header
	if i < 0 || i >= len(es) || es[i].agent < 0 {
		return 0, false
	}
	return es[i].agent, true
}

// moveSel moves the cursor in the list, and the feed pane back to the
// newest events of the agent it lands on.
func (m *Model) moveSel(d int) {
	before := m.sel
	m.sel += d
	m.clamp()
	if m.sel != before {
		m.fv = feedView{follow: true}
	}
}
