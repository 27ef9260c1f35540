package tui

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/shoalfabric/shoal/schemas"
)

var (
	styleTitle    = lipgloss.NewStyle().Bold(true)
	styleDim      = lipgloss.NewStyle().Foreground(lipgloss.Color("8"))
	styleSelected = lipgloss.NewStyle().Reverse(true)
	styleHeader   = lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("12"))
	styleError    = lipgloss.NewStyle().Foreground(lipgloss.Color("9"))
	styleTool     = lipgloss.NewStyle().Foreground(lipgloss.Color("13"))
	styleUser     = lipgloss.NewStyle().Foreground(lipgloss.Color("14"))
	styleTurn     = lipgloss.NewStyle().Foreground(lipgloss.Color("8"))
	styleAsk      = lipgloss.NewStyle().Foreground(lipgloss.Color("11"))
	styleBox      = lipgloss.NewStyle().Border(lipgloss.RoundedBorder()).Padding(0, 1)

	statusColor = map[schemas.AgentStatus]lipgloss.Color{
		schemas.StatusStarting: "12", schemas.StatusIdle: "10", schemas.StatusWorking: "14",
		schemas.StatusClosed: "8", schemas.StatusDead: "8",
	}
)

const amber = lipgloss.Color("214")

// View implements tea.Model.
func (m *Model) View() string {
	if m.width == 0 {
		return "starting…"
	}
	shown := m.shown()
	header := m.header(shown)
	h := m.bodyHeight()
	var body []string
	if m.nodesView {
		body = strings.Split(m.nodesTable(), "\n")
	} else {
		// Two columns, joined line by line: each line is clipped and
		// padded to its column once, so a frame costs what it shows.
		left, right := m.listLines(shown, h), m.detailLines(shown, h)
		lw := m.listWidth()
		for i := range h {
			var l, r string
			if i < len(left) {
				l = left[i]
			}
			if i < len(right) {
				r = right[i]
			}
			body = append(body, pad(l, lw)+" "+r)
		}
	}
	if len(body) > h {
		body = body[:h]
	}
	for len(body) < h {
		body = append(body, "")
	}
	screen := header + "\n" + strings.Join(body, "\n") + "\n" + m.footer()
	switch m.overlay {
	case detailOverlay:
		return m.popup("event", m.detail)
	case helpOverlay:
		return m.popup("keys", helpText)
	case confirmOverlay:
		a, _ := m.selected()
		return m.popup("close", fmt.Sprintf("Close agent %s on %s? It stops and everything it started.\n\ny: close   any other key: keep it", a.ID, a.Node))
	case transcriptOverlay:
		return m.transcriptView()
	}
	return screen
}

const helpText = `↑/↓ j/k    select an agent (or an event, in the feed)
tab        move between the agent list and the event feed
enter      in the list: go to the feed; in the feed: the event in full
t          the agent's whole transcript, from the stream (↑/↓, PgUp/PgDn)
x          close a live agent (asks first), dismiss a dead one
/          filter by id, node, status, model or directory (esc clears)
g          group the list by node, or not
n          the nodes of the fabric
esc        close a popup; ?  this help; q  quit
mouse      click to select, wheel to move`

func (m *Model) bodyHeight() int { return max(3, m.height-2) }

func (m *Model) listWidth() int { return max(24, min(48, m.width*2/5)) }

func (m *Model) header(shown []schemas.AgentRecord) string {
	working := 0
	for _, a := range shown {
		if a.Status == schemas.StatusWorking {
			working++
		}
	}
	view := "agents"
	if m.nodesView {
		view = "nodes"
	}
	h := fmt.Sprintf("shoal · %d agents (%d working) · %d nodes · %s", len(shown), working, len(m.nodes), view)
	if m.byNode && !m.nodesView {
		h += " · by node"
	}
	if q := m.filter.Value(); q != "" && !m.filtering {
		h += " · filter " + q
	}
	return styleTitle.Render(h)
}

func (m *Model) footer() string {
	if m.filtering {
		return m.filter.View()
	}
	if m.status != "" {
		return styleDim.Render(m.status)
	}
	return styleDim.Render("? keys · tab feed · enter detail · t transcript · x close · / filter · n nodes · q quit")
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

// listLines are the agent list's lines that fit in h rows.
func (m *Model) listLines(shown []schemas.AgentRecord, h int) []string {
	w := m.listWidth()
	es := m.entries(shown)
	if len(es) == 0 {
		if m.filter.Value() != "" {
			return []string{styleDim.Render("no agent matches the filter")}
		}
		return []string{styleDim.Render("no agents yet: shoal open DIR")}
	}
	var out []string
	for _, e := range es[m.top(es, h):] {
		if len(out) == h {
			break
		}
		if e.agent < 0 {
			out = append(out, styleHeader.Render(clip(e.node, w)))
			continue
		}
		a := shown[e.agent]
		text := fmt.Sprintf("%-8s %-8s %s", a.ID, a.Status, a.Model)
		if !m.byNode {
			text += " " + a.Node
		}
		if e.agent == m.sel && !m.feedFocus {
			out = append(out, styleSelected.Render(clip("● "+text, w)))
			continue
		}
		dot := lipgloss.NewStyle().Foreground(m.color(a)).Render("●")
		out = append(out, dot+" "+clip(text, w-2))
	}
	return out
}

// rowAt is the agent shown on screen row y.
func (m *Model) rowAt(y int) (int, bool) {
	es := m.entries(m.shown())
	i := m.listTop + y - 1 // below the header
	if i < 0 || i >= len(es) || es[i].agent < 0 {
		return 0, false
	}
	return es[i].agent, true
}

// color is an agent's status colour: working pulses, and turns amber
// when the agent has been silent too long.
func (m *Model) color(a schemas.AgentRecord) lipgloss.Color {
	if a.Status == schemas.StatusWorking {
		if f := m.feeds[a.ID]; f != nil && !f.lastActivity.IsZero() && m.now.Sub(f.lastActivity) > m.opts.Silent {
			return amber
		}
		if m.tick%2 == 1 {
			return "6"
		}
	}
	if c, ok := statusColor[a.Status]; ok {
		return c
	}
	return "7"
}

func (m *Model) detailLines(shown []schemas.AgentRecord, h int) []string {
	if m.sel < 0 || m.sel >= len(shown) {
		return nil
	}
	a := shown[m.sel]
	w := m.width - m.listWidth() - 1
	last := "—"
	if f := m.feeds[a.ID]; f != nil && !f.lastActivity.IsZero() {
		last = m.now.Sub(f.lastActivity).Round(time.Second).String() + " ago"
	} else if a.LastActivity > 0 {
		last = m.now.Sub(time.Unix(0, int64(a.LastActivity*1e9))).Round(time.Second).String() + " ago"
	}
	status := lipgloss.NewStyle().Foreground(m.color(a)).Render(string(a.Status))
	lines := []string{
		styleTitle.Render("agent "+a.ID) + "  node " + a.Node + "  " + status,
		clip(fmt.Sprintf("model %s  turn %d  tokens %d in / %d out", a.Model, a.Turn, a.Usage.InputTokens, a.Usage.OutputTokens), w),
		clip("cwd "+a.CWD, w),
		styleDim.Render("last activity " + last),
		styleDim.Render(strings.Repeat("─", max(1, w-2))),
	}
	for i, l := range m.feedOfShown(a.ID, h) {
		if len(lines) >= h {
			break
		}
		text := clip(l.text, w)
		switch l.kind {
		case "error":
			text = styleError.Render(text)
		case "tool":
			text = styleTool.Render(text)
		case "user":
			text = styleUser.Render(text)
		case "turn", "status":
			text = styleTurn.Render(text)
		case "permission":
			text = styleAsk.Render(text)
		case "thought":
			text = styleDim.Render(text)
		}
		if m.feedFocus && i == m.feedSel {
			text = styleSelected.Render(clip(l.text, w))
		}
		lines = append(lines, text)
	}
	return lines
}

func (m *Model) nodesTable() string {
	if len(m.nodes) == 0 {
		return styleDim.Render("no nodes: start one with shoal up or shoal node")
	}
	ns := append([]schemas.NodeRecord(nil), m.nodes...)
	sort.Slice(ns, func(i, j int) bool { return ns[i].Name < ns[j].Name })
	out := []string{styleHeader.Render(fmt.Sprintf("%-16s %-34s %-8s %-8s %s", "NODE", "RUNS", "AGENTS", "SEEN", "MODELS"))}
	for _, n := range ns {
		var runs []string
		models := 0
		for _, b := range n.Backends {
			name := b.Kind
			if b.Agent != "" {
				name += ":" + b.Agent
			}
			if !b.Ready {
				name += "(no)"
			}
			runs = append(runs, name)
			models += len(b.Models)
		}
		agents := fmt.Sprint(n.Agents)
		if n.MaxAgents > 0 {
			agents += fmt.Sprintf("/%d", n.MaxAgents)
		}
		seen := m.now.Sub(time.Unix(0, int64(n.Heartbeat*1e9))).Round(time.Second).String()
		out = append(out, clip(fmt.Sprintf("%-16s %-34s %-8s %-8s %d", n.Name, strings.Join(runs, " "), agents, seen, models), m.width))
	}
	return strings.Join(out, "\n")
}

func (m *Model) popup(title, text string) string {
	w := max(20, m.width-8)
	lines := strings.Split(text, "\n")
	if h := m.height - 4; len(lines) > h && h > 0 {
		lines = append(lines[:h-1], "…")
	}
	for i, l := range lines {
		lines[i] = clip(l, w-4)
	}
	box := styleBox.Width(w).Render(styleTitle.Render(title) + "\n" + strings.Join(lines, "\n") + "\n" + styleDim.Render("esc closes"))
	return lipgloss.Place(m.width, m.height, lipgloss.Center, lipgloss.Center, box)
}

func (m *Model) transcriptView() string {
	a, _ := m.selected()
	h := m.bodyHeight()
	end := min(len(m.lines), m.scroll+h)
	var body []string
	for _, l := range m.lines[min(m.scroll, end):end] {
		body = append(body, clip(l, m.width))
	}
	head := styleTitle.Render(fmt.Sprintf("transcript of %s · lines %d–%d of %d", a.ID, m.scroll+1, end, len(m.lines)))
	return head + "\n" + lipgloss.NewStyle().Height(h).Render(strings.Join(body, "\n")) + "\n" + styleDim.Render("↑/↓ PgUp/PgDn g/G · esc closes")
}

// clip cuts s, which may hold styles, to w cells.
func clip(s string, w int) string {
	if w <= 0 {
		return ""
	}
	return ansi.Truncate(s, w, "…")
}

// pad clips s to w cells and fills it to w with spaces.
func pad(s string, w int) string {
	s = clip(s, w)
	if n := ansi.StringWidth(s); n < w {
		s += strings.Repeat(" ", w-n)
	}
	return s
}
