package tui

import (
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
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

	statusColor = map[schemas.AgentStatus]color.Color{
		schemas.StatusStarting: lipgloss.Color("12"), schemas.StatusIdle: lipgloss.Color("10"), schemas.StatusWorking: lipgloss.Color("14"),
		schemas.StatusClosed: lipgloss.Color("8"), schemas.StatusDead: lipgloss.Color("8"),
	}
	amber = lipgloss.Color("214")
	pulse = lipgloss.Color("6")
	plain = lipgloss.Color("7")
)

// View implements tea.Model: the monitor takes the whole screen (the
// alternate screen) and the mouse's clicks and wheel.
func (m *Model) View() tea.View {
	v := tea.NewView(m.frame())
	v.AltScreen = true
	v.MouseMode = tea.MouseModeCellMotion
	return v
}

// frame is the screen's text.
func (m *Model) frame() string {
	if m.width == 0 {
		return "starting…"
	}
	switch m.overlay {
	case detailOverlay, helpOverlay:
		return m.detail.view(m)
	case confirmOverlay:
		return m.box(m.confirm.title, m.wrapped(splitLines(m.confirm.text)), m.confirm.keys)
	case formOverlay:
		return m.formView()
	case permitOverlay:
		return m.permitView()
	case transcriptOverlay:
		return m.transcriptView()
	}
	shown := m.shown()
	header := m.header(shown)
	h := m.bodyHeight()
	var body []string
	if m.nodesView {
		body = m.nodesTable()
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
	return header + "\n" + strings.Join(body, "\n") + "\n" + m.footer()
}

const helpText = `↑/↓ j/k    select an agent (or an event, in the feed)
tab        move between the agent list and the event feed
enter      in the list: go to the feed; in the feed: the event in full
PgUp/PgDn  in the feed: a page up or down; End: back to the newest
t          the agent's whole transcript (↑/↓, PgUp/PgDn, enter expands a tool)
s          send the agent a turn
i          interrupt its turn (asks first)
p          answer its permission requests (⚠ in the list)
m          set its model
o          open an agent: directory, model, preset
x          close a live agent (asks first), dismiss a dead one
/          filter by id, node, status, model or directory (esc clears)
g          group the list by node, or not
n          the nodes of the fabric
esc        close a popup; ?  this help; q  quit
mouse      click to select, wheel to move or scroll

The feed and the transcript read like a terminal: oldest at the top,
newest at the bottom, and they follow the newest unless you scroll up.`

func (m *Model) bodyHeight() int { return max(3, m.height-2) }

func (m *Model) listWidth() int { return max(24, min(56, m.width*2/5)) }

func (m *Model) header(shown []schemas.AgentRecord) string {
	working, waiting := 0, 0
	for _, a := range shown {
		if a.Status == schemas.StatusWorking {
			working++
		}
		waiting += len(m.permits[a.ID])
	}
	view := "agents"
	if m.nodesView {
		view = "nodes"
	}
	h := fmt.Sprintf("shoal · %d agents (%d working) · %d nodes · %s", len(shown), working, len(m.nodes), view)
	switch {
	case m.permitsOmitted > 0:
		// More wait than the fabric's reply could list: the count is
		// of the whole fabric, not of the agents shown.
		h += fmt.Sprintf(" · ⚠ %d waiting, %d more not listed", waiting, m.permitsOmitted)
	case waiting > 0:
		h += fmt.Sprintf(" · ⚠ %d waiting", waiting)
	}
	h += m.spendNote()
	if m.byNode && !m.nodesView {
		h += " · by node"
	}
	if q := m.filter.Value(); q != "" && !m.filtering {
		h += " · filter " + q
	}
	return clip(styleTitle.Render(h), m.width)
}

// footer is the status line: the live feed's trouble, an action's
// outcome, a failed read, or the main keys.
func (m *Model) footer() string {
	if m.filtering {
		return m.filter.View()
	}
	var parts []string
	if m.feedLost != "" {
		parts = append(parts, styleAsk.Render(m.feedLost))
	}
	if m.status != "" {
		if m.statusErr {
			parts = append(parts, styleError.Render("✖ "+m.status))
		} else {
			parts = append(parts, m.status)
		}
	}
	if m.pollErr != "" {
		parts = append(parts, styleError.Render(m.pollErr))
	}
	if len(parts) == 0 {
		if m.opts.Observer {
			return styleDim.Render(clip("watching only · ? keys · t transcript · / filter · n nodes · q quit", m.width))
		}
		return styleDim.Render(clip("? keys · s send · i interrupt · p permissions · m model · o open · x close · t transcript · / filter · n nodes · q quit", m.width))
	}
	return clip(strings.Join(parts, " · "), m.width)
}

// listLines are the agent list's lines that fit in h rows: a line of
// column headers, then the agents, under their node when grouped.
func (m *Model) listLines(shown []schemas.AgentRecord, h int) []string {
	w := m.listWidth()
	idw := 2
	for _, a := range shown {
		idw = max(idw, min(16, len(a.ID)))
	}
	row := func(id, status, tokens, model string) string {
		return fmt.Sprintf("%-*s %-11s %6s %s", idw, clip(id, idw), status, tokens, model)
	}
	last := "MODEL"
	if !m.byNode {
		last = "MODEL · NODE"
	}
	out := []string{styleDim.Render(clip("  "+row("ID", "STATUS", "TOKENS", last), w))}
	es := m.entries(shown)
	if len(es) == 0 {
		if m.filter.Value() != "" {
			return append(out, styleDim.Render("no agent matches the filter"))
		}
		return append(out, styleDim.Render("no agents yet: o opens one"))
	}
	for _, e := range es[m.top(es, h-1):] {
		if len(out) == h {
			break
		}
		if e.agent < 0 {
			out = append(out, styleHeader.Render(clip(e.node, w)))
			continue
		}
		a := shown[e.agent]
		status := string(a.Status)
		if wt := m.waiting(a.ID); wt != "" {
			status = wt
		}
		model := a.Model
		if !m.byNode {
			model += " · " + a.Node
		}
		text := row(a.ID, status, tokens(a.Usage), model)
		if e.agent == m.sel && !m.feedFocus {
			out = append(out, styleSelected.Render(clip("● "+text, w)))
			continue
		}
		dot := lipgloss.NewStyle().Foreground(m.color(a)).Render("●")
		if m.waiting(a.ID) != "" {
			text = styleAsk.Render(text)
		}
		out = append(out, dot+" "+clip(text, w-2))
	}
	return out
}

// spendNote is what the header says of the fleet's spend: its tokens (and
// cost, where one was reported), against the fleet's budget when there is
// one, and a warning once it is reached.
func (m *Model) spendNote() string {
	if m.spend == nil {
		return ""
	}
	used := m.spend.Spent.Fleet()
	var fleet *schemas.BudgetLine
	for i, b := range m.spend.Budgets {
		if b.Fleet {
			fleet = &m.spend.Budgets[i]
		}
	}
	note := " · spent " + tokens(used)
	if fleet != nil && fleet.Budget.Tokens > 0 {
		note += " of " + tokens(schemas.Usage{InputTokens: fleet.Budget.Tokens})
	}
	note += " tokens"
	if used.CostUSD != nil && *used.CostUSD > 0 {
		note += ", " + dollars(*used.CostUSD)
		if fleet != nil && fleet.Budget.USD > 0 {
			note += " of " + dollars(fleet.Budget.USD)
		}
	} else if fleet != nil && fleet.Budget.USD > 0 {
		note += ", $0.00 of " + dollars(fleet.Budget.USD)
	}
	if fleet != nil && fleet.Budget.Over(schemas.Scope{Fleet: true}, fleet.Used) != nil {
		note += " ⚠ fleet budget reached"
	}
	return note
}

// dollars is an amount in cents, or, below a dollar, to its first two
// figures: a fleet that spent $0.0037 read "$0.00".
func dollars(v float64) string {
	places := 2
	for v > 0 && v < 1 && v*math.Pow10(places) < 10 && places < 6 {
		places++
	}
	return "$" + strconv.FormatFloat(v, 'f', places, 64)
}

// tokens is an agent's token count, short.
func tokens(u schemas.Usage) string {
	n := u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheCreationTokens
	switch {
	case n < 1000:
		return fmt.Sprint(n)
	case n < 1_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1fM", float64(n)/1e6)
}

// color is an agent's status colour: working pulses, and turns amber
// when the agent has been silent too long.
func (m *Model) color(a schemas.AgentRecord) color.Color {
	if a.Status == schemas.StatusWorking {
		if f := m.feeds[a.ID]; f != nil && !f.lastActivity.IsZero() && m.now.Sub(f.lastActivity) > m.opts.Silent {
			return amber
		}
		if m.tick%2 == 1 {
			return pulse
		}
	}
	if c, ok := statusColor[a.Status]; ok {
		return c
	}
	return plain
}

// recordLines is how many lines the selected agent's record takes above
// its feed.
const recordLines = 5

// feedRows is how many feed lines the detail pane shows.
func (m *Model) feedRows() int { return max(1, m.bodyHeight()-recordLines) }

// detailLines are the selected agent's record, then its feed, oldest at
// the top.
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
		last = m.now.Sub(floatTime(a.LastActivity)).Round(time.Second).String() + " ago"
	}
	activity := styleDim.Render("last activity " + last)
	if wt := m.waiting(a.ID); wt != "" {
		activity += "  " + styleAsk.Render(wt+": p answers")
	}
	status := lipgloss.NewStyle().Foreground(m.color(a)).Render(string(a.Status))
	lines := []string{
		clip(styleTitle.Render("agent "+a.ID)+"  node "+a.Node+"  "+status, w),
		clip(fmt.Sprintf("model %s  turn %d  tokens %d in / %d out", a.Model, a.Turn, a.Usage.InputTokens, a.Usage.OutputTokens), w),
		clip(m.where(a), w),
		clip(activity, w),
		styleDim.Render(strings.Repeat("─", max(1, w-2))),
	}
	f := m.feeds[a.ID]
	if f == nil {
		return lines
	}
	from, to := m.fv.fit(f, h-len(lines))
	for id := from; id < to; id++ {
		i := id - f.dropped
		l := f.lines[i]
		text := clip(f.text(i), w)
		if m.feedFocus && id == m.fv.sel {
			lines = append(lines, styleSelected.Render(text))
			continue
		}
		text = styleKind(l.kind, text)
		lines = append(lines, text)
	}
	return lines
}

// eventDetail is the full text of a feed line's event.
func eventDetail(l line) string {
	b, err := schemas.Encode(l.ev)
	if err != nil {
		return l.text
	}
	return strings.Join(prettyJSON(b), "\n")
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

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

// styleKind colours a line of the feed or the transcript by its kind.
func styleKind(kind, text string) string {
	switch kind {
	case "error":
		return styleError.Render(text)
	case "tool":
		return styleTool.Render(text)
	case "user":
		return styleUser.Render(text)
	case "turn", "status":
		return styleTurn.Render(text)
	case "permission":
		return styleAsk.Render(text)
	case "thought":
		return styleDim.Render(text)
	}
	return text
}

// where is the agent's working directory or, for an agent on a
// repository, the repository, its branch and how many files it changed.
func (m *Model) where(a schemas.AgentRecord) string {
	ws := a.Workspace
	if ws == nil {
		return "cwd " + a.CWD
	}
	base := ws.Base
	if len(base) > 12 {
		base = base[:12]
	}
	line := "repo " + ws.Source + " on " + ws.Branch + " from " + base
	if n, ok := m.changed[a.ID]; ok {
		line += fmt.Sprintf("  %d files changed", n)
	}
	return line
}
