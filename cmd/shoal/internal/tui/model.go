// Package tui is `shoal tui`: a live terminal monitor of every agent of
// the fabric and of its nodes.
package tui

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/shoalfabric/shoal/schemas"
)

// Source is where the monitor reads the fabric.
type Source interface {
	// Agents lists every agent's record.
	Agents(ctx context.Context) ([]schemas.AgentRecord, error)
	// Nodes lists the nodes whose heartbeat is current.
	Nodes(ctx context.Context) ([]schemas.NodeRecord, error)
	// Follow calls fn with every agent's events from now on, until ctx
	// ends.
	Follow(ctx context.Context, fn func(agent string, ev schemas.Event)) error
	// History returns an agent's stored events, oldest first, at most max
	// of the newest.
	History(ctx context.Context, agent string, max int) ([]schemas.Event, error)
	// Close closes an agent.
	Close(ctx context.Context, agent string) error
}

// Options tune the monitor.
type Options struct {
	// Poll is how often the agent and node lists are read again; 1s when
	// zero.
	Poll time.Duration
	// Silent is how long a working agent may say nothing before it is
	// shown amber; 30s when zero.
	Silent time.Duration
}

// incoming is one event the follower received.
type incoming struct {
	agent string
	ev    schemas.Event
	at    time.Time
}

type (
	tickMsg    time.Time
	agentsMsg  []schemas.AgentRecord
	nodesMsg   []schemas.NodeRecord
	eventsMsg  []incoming
	historyMsg struct {
		agent      string
		evs        []schemas.Event
		transcript bool
	}
	errMsg    struct{ err error }
	closedMsg struct {
		agent string
		err   error
	}
	followEndsMsg struct{ err error }
)

type overlay int

const (
	noOverlay overlay = iota
	detailOverlay
	transcriptOverlay
	helpOverlay
	confirmOverlay
)

// Model is the monitor's state; run it with tea.NewProgram.
type Model struct {
	ctx  context.Context
	src  Source
	opts Options

	width, height int
	agents        []schemas.AgentRecord
	feeds         map[string]*feed
	nodes         []schemas.NodeRecord
	dismissed     map[string]bool
	events        chan incoming

	sel       int // the selected agent among those shown
	listTop   int // the first line of the list on screen
	feedFocus bool
	feedSel   int // the selected line, counted from the newest
	nodesView bool
	byNode    bool
	overlay   overlay
	detail    string
	lines     []string // the transcript overlay's
	scroll    int
	filtering bool
	filter    textinput.Model
	status    string
	tick      int
	now       time.Time
}

// New returns a monitor reading src.
func New(ctx context.Context, src Source, opts Options) *Model {
	if opts.Poll == 0 {
		opts.Poll = time.Second
	}
	if opts.Silent == 0 {
		opts.Silent = 30 * time.Second
	}
	ti := textinput.New()
	ti.Prompt = "/"
	ti.Placeholder = "filter: id, node, status, model, directory"
	return &Model{
		ctx: ctx, src: src, opts: opts,
		feeds: map[string]*feed{}, dismissed: map[string]bool{},
		events: make(chan incoming, 1<<14), filter: ti, byNode: true, now: time.Now(),
	}
}

// Init implements tea.Model: the first reads, the follower, the clock.
func (m *Model) Init() tea.Cmd {
	go func() {
		err := m.src.Follow(m.ctx, func(agent string, ev schemas.Event) {
			select {
			case m.events <- incoming{agent, ev, time.Now()}:
			case <-m.ctx.Done():
			}
		})
		if m.ctx.Err() == nil {
			m.events <- incoming{agent: "", ev: schemas.Event{Payload: schemas.Errorf("the live feed stopped: %v", err)}}
		}
	}()
	return tea.Batch(m.readAgents(0), m.readNodes(0), m.nextEvents(), tickEvery())
}

func tickEvery() tea.Cmd {
	return tea.Tick(500*time.Millisecond, func(t time.Time) tea.Msg { return tickMsg(t) })
}

func (m *Model) readAgents(after time.Duration) tea.Cmd {
	return func() tea.Msg {
		if after > 0 {
			time.Sleep(after)
		}
		as, err := m.src.Agents(m.ctx)
		if err != nil {
			return errMsg{err}
		}
		return agentsMsg(as)
	}
}

func (m *Model) readNodes(after time.Duration) tea.Cmd {
	return func() tea.Msg {
		if after > 0 {
			time.Sleep(after)
		}
		ns, err := m.src.Nodes(m.ctx)
		if err != nil {
			return errMsg{err}
		}
		return nodesMsg(ns)
	}
}

// nextEvents waits for the follower, then takes everything it has, so a
// fabric of busy agents costs one update per batch, not per event.
func (m *Model) nextEvents() tea.Cmd {
	return func() tea.Msg {
		var batch []incoming
		select {
		case in := <-m.events:
			batch = append(batch, in)
		case <-m.ctx.Done():
			return nil
		}
		for len(batch) < 4096 {
			select {
			case in := <-m.events:
				batch = append(batch, in)
			default:
				return eventsMsg(batch)
			}
		}
		return eventsMsg(batch)
	}
}

func (m *Model) history(agent string, transcript bool) tea.Cmd {
	return func() tea.Msg {
		max := 300
		if transcript {
			max = 5000
		}
		evs, err := m.src.History(m.ctx, agent, max)
		if err != nil {
			return errMsg{fmt.Errorf("events of %s: %w", agent, err)}
		}
		return historyMsg{agent: agent, evs: evs, transcript: transcript}
	}
}

// Update implements tea.Model.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tickMsg:
		m.tick++
		m.now = time.Time(msg)
		return m, tickEvery()
	case agentsMsg:
		m.setAgents(msg)
		return m, tea.Batch(m.readAgents(m.opts.Poll), m.backfill())
	case nodesMsg:
		m.nodes = msg
		return m, m.readNodes(2 * m.opts.Poll)
	case eventsMsg:
		for _, in := range msg {
			if in.agent == "" {
				m.status = eventText(in.ev)
				continue
			}
			m.feedOf(in.agent).add(in.ev, in.at)
			m.applyStatus(in.agent, in.ev)
		}
		return m, m.nextEvents()
	case historyMsg:
		if msg.transcript {
			m.lines = transcript(msg.evs)
			m.scroll = max(0, len(m.lines)-m.bodyHeight())
			return m, nil
		}
		f := newFeed()
		for _, ev := range msg.evs {
			f.add(ev, time.Time{})
		}
		if old := m.feeds[msg.agent]; old != nil {
			f.lastActivity = old.lastActivity
		}
		f.backfilled = true
		m.feeds[msg.agent] = f
	case errMsg:
		m.status = msg.err.Error()
		return m, tea.Batch(m.readAgents(m.opts.Poll), m.readNodes(2*m.opts.Poll))
	case closedMsg:
		if msg.err != nil {
			m.status = fmt.Sprintf("closing %s: %v", msg.agent, msg.err)
		} else {
			m.status = "closed " + msg.agent
		}
	case tea.MouseMsg:
		return m, m.mouse(msg)
	case tea.KeyMsg:
		return m, m.key(msg)
	}
	return m, nil
}

// setAgents takes a fresh list, keeping the selection on the same agent.
func (m *Model) setAgents(as []schemas.AgentRecord) {
	var keep string
	if a, ok := m.selected(); ok {
		keep = a.ID
	}
	m.agents = as
	m.sort()
	if keep != "" {
		for i, a := range m.shown() {
			if a.ID == keep {
				m.sel = i
			}
		}
	}
	m.clamp()
}

func (m *Model) sort() {
	rank := map[schemas.AgentStatus]int{schemas.StatusWorking: 0, schemas.StatusStarting: 1, schemas.StatusIdle: 2, schemas.StatusClosed: 3, schemas.StatusDead: 4}
	sort.SliceStable(m.agents, func(i, j int) bool {
		a, b := m.agents[i], m.agents[j]
		if m.byNode && a.Node != b.Node {
			return a.Node < b.Node
		}
		if rank[a.Status] != rank[b.Status] {
			return rank[a.Status] < rank[b.Status]
		}
		return a.ID < b.ID
	})
}

// backfill loads the stored events of an agent selected for the first
// time.
func (m *Model) backfill() tea.Cmd {
	a, ok := m.selected()
	if !ok {
		return nil
	}
	if f := m.feeds[a.ID]; f != nil && f.backfilled {
		return nil
	}
	m.feedOf(a.ID).backfilled = true
	return m.history(a.ID, false)
}

func (m *Model) feedOf(id string) *feed {
	f := m.feeds[id]
	if f == nil {
		f = newFeed()
		m.feeds[id] = f
	}
	return f
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

// feedLines are the selected agent's lines, newest first, at most n.
func (m *Model) feedLines(n int) []line {
	a, ok := m.selected()
	if !ok {
		return nil
	}
	return m.feedOfShown(a.ID, n)
}

func (m *Model) feedOfShown(id string, n int) []line {
	f := m.feeds[id]
	if f == nil {
		return nil
	}
	out := make([]line, 0, min(n, len(f.lines)))
	for i := len(f.lines) - 1; i >= 0 && len(out) < n; i-- {
		l := f.lines[i]
		l.text = f.text(i)
		out = append(out, l)
	}
	return out
}

func (m *Model) key(k tea.KeyMsg) tea.Cmd {
	if m.filtering {
		switch k.Type {
		case tea.KeyEnter, tea.KeyEsc:
			m.filtering = false
			m.filter.Blur()
			if k.Type == tea.KeyEsc {
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
		m.overlay = noOverlay
		if k.String() == "y" {
			return m.closeSelected()
		}
		m.status = "nothing closed"
		return nil
	case detailOverlay, helpOverlay:
		if k.Type == tea.KeyEsc || k.String() == "q" || k.Type == tea.KeyEnter || k.String() == "?" {
			m.overlay = noOverlay
		}
		return nil
	case transcriptOverlay:
		switch k.String() {
		case "esc", "q", "t":
			m.overlay = noOverlay
		case "up", "k":
			m.scroll = max(0, m.scroll-1)
		case "down", "j":
			m.scroll = min(max(0, len(m.lines)-m.bodyHeight()), m.scroll+1)
		case "pgup":
			m.scroll = max(0, m.scroll-m.bodyHeight())
		case "pgdown", " ":
			m.scroll = min(max(0, len(m.lines)-m.bodyHeight()), m.scroll+m.bodyHeight())
		case "home", "g":
			m.scroll = 0
		case "end", "G":
			m.scroll = max(0, len(m.lines)-m.bodyHeight())
		}
		return nil
	}
	switch k.String() {
	case "ctrl+c", "q":
		return tea.Quit
	case "?":
		m.overlay = helpOverlay
	case "esc":
		m.feedFocus = false
	case "tab":
		m.feedFocus = !m.feedFocus && !m.nodesView
		m.feedSel = 0
	case "n":
		m.nodesView = !m.nodesView
		m.feedFocus = false
	case "g":
		m.byNode = !m.byNode
		m.sort()
	case "/":
		m.filtering = true
		m.feedFocus = false
		return m.filter.Focus()
	case "up", "k":
		m.move(-1)
		return m.backfill()
	case "down", "j":
		m.move(1)
		return m.backfill()
	case "enter":
		if !m.feedFocus {
			m.feedFocus, m.feedSel = true, 0
			return nil
		}
		lines := m.feedLines(maxFeed)
		if m.feedSel < len(lines) {
			m.detail = eventDetail(lines[m.feedSel])
			m.overlay = detailOverlay
		}
	case "t":
		if a, ok := m.selected(); ok {
			m.lines, m.scroll = []string{"reading the stream…"}, 0
			m.overlay = transcriptOverlay
			return m.history(a.ID, true)
		}
	case "x":
		if a, ok := m.selected(); ok {
			if a.Status == schemas.StatusDead {
				m.dismissed[a.ID] = true
				m.status = "dismissed " + a.ID
				m.clamp()
				return m.backfill()
			}
			m.overlay = confirmOverlay
		}
	}
	return nil
}

func (m *Model) move(d int) {
	if m.feedFocus {
		m.feedSel = max(0, min(m.feedSel+d, len(m.feedLines(maxFeed))-1))
		return
	}
	m.sel += d
	m.clamp()
}

func (m *Model) closeSelected() tea.Cmd {
	a, ok := m.selected()
	if !ok {
		return nil
	}
	m.status = "closing " + a.ID + "…"
	return func() tea.Msg {
		return closedMsg{agent: a.ID, err: m.src.Close(m.ctx, a.ID)}
	}
}

// mouse: the wheel moves the selection, a click on a row selects it.
func (m *Model) mouse(e tea.MouseMsg) tea.Cmd {
	switch {
	case e.Button == tea.MouseButtonWheelUp && e.Action == tea.MouseActionPress:
		m.move(-1)
		return m.backfill()
	case e.Button == tea.MouseButtonWheelDown && e.Action == tea.MouseActionPress:
		m.move(1)
		return m.backfill()
	case e.Button == tea.MouseButtonLeft && e.Action == tea.MouseActionPress && m.overlay == noOverlay && !m.nodesView:
		if e.X < m.listWidth() {
			if i, ok := m.rowAt(e.Y); ok {
				m.sel, m.feedFocus = i, false
				return m.backfill()
			}
		} else {
			m.feedFocus = true
		}
	}
	return nil
}

// eventDetail is the full text of a feed line's event.
func eventDetail(l line) string {
	b, err := schemas.Encode(l.ev)
	if err != nil {
		return l.text
	}
	var v any
	json.Unmarshal(b, &v)
	pretty, _ := json.MarshalIndent(v, "", "  ")
	return string(pretty)
}

// transcript renders an agent's stored events, one line per event that
// a reader wants (no streamed chunks).
func transcript(evs []schemas.Event) []string {
	f := newFeed()
	for _, ev := range evs {
		f.add(ev, time.Time{})
	}
	out := make([]string, 0, len(f.lines))
	for i, l := range f.lines {
		l.text = f.text(i)
		if l.kind == "text" || l.kind == "thought" {
			// The whole text, not a line of it.
			switch p := l.ev.Payload.(type) {
			case schemas.AssistantText:
				out = append(out, strings.Split(strings.TrimRight(p.Content.Text, "\n"), "\n")...)
				continue
			case schemas.Thought:
				for _, t := range strings.Split(strings.TrimRight(p.Content.Text, "\n"), "\n") {
					out = append(out, "✻ "+t)
				}
				continue
			}
		}
		out = append(out, l.text)
	}
	if len(out) == 0 {
		out = []string{"(no events stored)"}
	}
	return out
}

func eventText(ev schemas.Event) string {
	if e, ok := ev.Payload.(schemas.Error); ok {
		return e.Message
	}
	return string(ev.Kind())
}
