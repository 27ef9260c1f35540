package tui

import (
	"context"
	"errors"
	"fmt"
	"time"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// Options tune the monitor.
type Options struct {
	// Poll is how often the agent and node lists are read again; 1s when
	// zero.
	Poll time.Duration
	// Silent is how long a working agent may say nothing before it is
	// shown amber; 30s when zero.
	Silent time.Duration
	// Dir is the directory the open form offers when no agent is
	// selected.
	Dir string
	// Observer is a monitor that may only watch (observer credentials):
	// it offers no action, and says so at the key.
	Observer bool
}

// incoming is one event the follower received, and when.
type incoming struct {
	ev Event
	at time.Time
}

type (
	tickMsg   time.Time
	agentsMsg []schemas.AgentRecord
	nodesMsg  []schemas.NodeRecord
	spendMsg  struct {
		rep schemas.BudgetsReply
		err error
	}
	pendingMsg struct {
		schemas.PendingReply
		err  error
		once bool // a read outside the poll, which schedules none
	}
	eventsMsg  []incoming
	historyMsg struct {
		agent      string
		evs        []Event
		transcript bool
		err        error
	}
	pollErrMsg  struct{ err error }
	nodesErrMsg struct{}
	// doneMsg is an action's outcome, for the status line.
	doneMsg struct {
		text string
		err  error
		// open is the agent an open made: the cursor goes to it.
		open string
		// answered is the permission request an answer settled.
		answered *schemas.PermitRecord
	}
	feedMsg feedState
)

type overlay int

const (
	noOverlay overlay = iota
	detailOverlay
	transcriptOverlay
	helpOverlay
	confirmOverlay
	formOverlay
	permitOverlay
)

// Model is the monitor's state; run it with tea.NewProgram.
type Model struct {
	ctx     context.Context
	src     Source
	opts    Options
	started time.Time

	width, height int
	agents        []schemas.AgentRecord
	feeds         map[string]*feed
	nodes         []schemas.NodeRecord
	dismissed     map[string]bool
	events        chan incoming
	feedStates    chan feedState

	sel       int    // the selected agent among those shown
	keep      string // the agent the cursor moves to once it is listed
	listTop   int    // the first entry of the list on screen
	feedFocus bool
	fv        feedView
	nodesView bool
	byNode    bool
	overlay   overlay
	detail    *scroller // the event in full, the help
	tr        *transcript
	confirm   *confirm
	form      *form
	permit    *permitView

	// permits are the open permission requests by agent; permitsOff
	// says why there are none to show when the fabric serves none.
	permits    map[string][]schemas.PermitRecord
	permitsOff error
	pendingErr error // why the last read of them failed
	// permitsOmitted counts the requests waiting that the fabric's
	// reply left out (too many to list in one).
	permitsOmitted int

	filtering bool
	filter    textinput.Model
	status    string // an action's outcome
	statusErr bool
	pollErr   string // why the last read of the lists failed
	feedLost  string // why the live feed is down, while it reconnects
	tick      int
	now       time.Time

	// changed is how many files each agent on a repository has changed,
	// as last read, and when; read again for the selected agent every
	// changedEvery.
	changed   map[string]int
	changedAt map[string]time.Time
	// spend is what the fleet spent and its budgets, as last read (nil
	// when the source does not say).
	spend *schemas.BudgetsReply
}

// changedEvery is how often the selected agent's changed files are
// counted again (each count is a git diff on its node).
const changedEvery = 5 * time.Second

// changedMsg is a count of an agent's changed files.
type changedMsg struct {
	agent string
	files int
	err   error
}

// readChanged counts the selected agent's changed files, when it is on a
// repository, the source can count, and the last count is old.
func (m *Model) readChanged() tea.Cmd {
	d, ok := m.src.(Differ)
	a, sel := m.selected()
	if !ok || !sel || a.Workspace == nil {
		return nil
	}
	if at, read := m.changedAt[a.ID]; read && m.now.Sub(at) < changedEvery {
		return nil
	}
	if m.changedAt == nil {
		m.changedAt, m.changed = map[string]time.Time{}, map[string]int{}
	}
	m.changedAt[a.ID] = m.now
	id := a.ID
	return func() tea.Msg {
		n, err := d.Changed(m.ctx, id)
		return changedMsg{agent: id, files: n, err: err}
	}
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
	now := time.Now()
	return &Model{
		ctx: ctx, src: src, opts: opts, started: now,
		feeds: map[string]*feed{}, dismissed: map[string]bool{}, permits: map[string][]schemas.PermitRecord{},
		events: make(chan incoming, 1<<14), feedStates: make(chan feedState, 4),
		filter: ti, byNode: true, now: now, fv: feedView{follow: true},
	}
}

// Init implements tea.Model: the first reads, the follower, the clock.
func (m *Model) Init() tea.Cmd {
	go m.follow()
	return tea.Batch(m.readAgents(0), m.readNodes(0), m.readSpend(0), m.readPending(0), m.nextEvents(), m.nextFeedState(), tickEvery())
}

func tickEvery() tea.Cmd {
	return tea.Tick(500*time.Millisecond, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// after runs read once d has passed, unless the monitor ends first.
func (m *Model) after(d time.Duration, read func() tea.Msg) tea.Cmd {
	return func() tea.Msg {
		if d > 0 {
			select {
			case <-time.After(d):
			case <-m.ctx.Done():
				return nil
			}
		}
		return read()
	}
}

func (m *Model) readAgents(d time.Duration) tea.Cmd {
	return m.after(d, func() tea.Msg {
		as, err := m.src.Agents(m.ctx)
		if err != nil {
			// As the live feed does: the coordinator is away, and the
			// monitor tries again.
			return pollErrMsg{fmt.Errorf("reconnecting… (the coordinator does not answer: %v)", unwrapped(err))}
		}
		return agentsMsg(as)
	})
}

func (m *Model) readNodes(d time.Duration) tea.Cmd {
	return m.after(d, func() tea.Msg {
		ns, err := m.src.Nodes(m.ctx)
		if err != nil {
			// The agents' read says the fabric is unreachable; the nodes
			// are read again all the same, so the view is not frozen once
			// it is back.
			return nodesErrMsg{}
		}
		return nodesMsg(ns)
	})
}

// readSpend reads what the fleet spent and its budgets, when the source
// says; a failed read is tried again later.
func (m *Model) readSpend(d time.Duration) tea.Cmd {
	sp, ok := m.src.(Spender)
	if !ok {
		return nil
	}
	return m.after(d, func() tea.Msg {
		rep, err := sp.Budgets(m.ctx)
		return spendMsg{rep, err}
	})
}

func (m *Model) readPending(d time.Duration) tea.Cmd {
	return m.after(d, func() tea.Msg {
		rep, err := m.src.Pending(m.ctx)
		return pendingMsg{PendingReply: rep, err: err}
	})
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

func (m *Model) nextFeedState() tea.Cmd {
	return func() tea.Msg {
		select {
		case s := <-m.feedStates:
			return feedMsg(s)
		case <-m.ctx.Done():
			return nil
		}
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
			err = fmt.Errorf("events of %s: %w", agent, err)
		}
		return historyMsg{agent: agent, evs: evs, transcript: transcript, err: err}
	}
}

// Update implements tea.Model.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	// What nodes and agents wrote reaches the terminal without their
	// escape sequences (render.Clean); the events' text is cleaned where
	// it is laid out (oneLine, the transcript).
	switch m := msg.(type) {
	case agentsMsg:
		render.CleanAll(&m)
		msg = m
	case nodesMsg:
		render.CleanAll(&m)
		msg = m
	case pendingMsg:
		render.CleanAll(&m.Requests)
		msg = m
	case spendMsg:
		render.CleanAll(&m.rep)
		msg = m
	}
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tickMsg:
		m.tick++
		m.now = time.Time(msg)
		return m, tickEvery()
	case agentsMsg:
		m.pollErr = ""
		m.setAgents(msg)
		return m, tea.Batch(m.readAgents(m.opts.Poll), m.backfill(), m.readChanged())
	case changedMsg:
		if msg.err == nil {
			m.changed[msg.agent] = msg.files
		}
		return m, nil
	case nodesMsg:
		m.nodes = msg
		return m, m.readNodes(2 * m.opts.Poll)
	case nodesErrMsg:
		return m, m.readNodes(2 * m.opts.Poll)
	case spendMsg:
		if msg.err == nil {
			m.spend = &msg.rep
		}
		return m, m.readSpend(2 * m.opts.Poll)
	case pendingMsg:
		return m, m.setPending(msg)
	case pollErrMsg:
		m.pollErr = render.OneLine(msg.err.Error())
		return m, m.readAgents(m.opts.Poll)
	case eventsMsg:
		var cmd tea.Cmd
		for _, in := range msg {
			m.feedOf(in.ev.Agent).take(in)
			m.applyStatus(in.ev.Agent, in.ev.Event)
			if m.tr != nil && m.tr.agent == in.ev.Agent {
				m.tr.add(in.ev)
			}
			if _, ok := in.ev.Event.Payload.(schemas.Permission); ok && m.permitsOff == nil {
				cmd = m.readPendingNow()
			}
		}
		return m, tea.Batch(m.nextEvents(), cmd)
	case feedMsg:
		if msg.lost != nil {
			m.feedLost = render.OneLine(fmt.Sprintf("live feed lost (%v); reconnecting…", msg.lost))
		} else if msg.back {
			m.feedLost = ""
			m.say("the live feed is back", nil)
		}
		return m, m.nextFeedState()
	case historyMsg:
		m.takeHistory(msg)
	case doneMsg:
		m.say(msg.text, msg.err)
		if msg.open != "" {
			m.keep = msg.open
		}
		if msg.answered != nil {
			m.dropPermit(*msg.answered)
			return m, m.readPendingNow()
		}
	case tea.MouseMsg:
		return m, m.mouse(msg)
	case tea.KeyPressMsg:
		return m, m.key(msg)
	case tea.PasteMsg:
		return m, m.paste(msg)
	}
	return m, nil
}

// say puts an action's outcome, or its error, on the status line: one
// line, with no escape sequence or control character of what a node, an
// agent or a model said in it.
func (m *Model) say(text string, err error) {
	m.status, m.statusErr = text, err != nil
	if err != nil {
		m.status = err.Error()
	}
	m.status = render.OneLine(m.status)
}

// takeHistory takes an agent's stored events: for the transcript, or as
// the feed of an agent selected for the first time, with what arrived
// live while they were read.
func (m *Model) takeHistory(msg historyMsg) {
	if msg.transcript {
		if m.tr == nil || m.tr.agent != msg.agent {
			return
		}
		if msg.err != nil {
			m.say("", msg.err)
		}
		m.tr.load(msg.evs)
		return
	}
	old := m.feeds[msg.agent]
	if msg.err != nil {
		m.say("", msg.err)
		if old != nil {
			old.loading, old.early = false, nil
		}
		return
	}
	f := newFeed()
	for _, ev := range msg.evs {
		f.add(ev, time.Time{})
	}
	if old != nil {
		for _, in := range old.early {
			f.add(in.ev, in.at)
		}
		f.lastActivity = old.lastActivity
	}
	f.backfilled = true
	m.feeds[msg.agent] = f
}

// backfill loads the stored events of an agent selected for the first
// time.
func (m *Model) backfill() tea.Cmd {
	a, ok := m.selected()
	if !ok {
		return nil
	}
	if f := m.feeds[a.ID]; f != nil && (f.backfilled || f.loading) {
		return nil
	}
	m.feedOf(a.ID).loading = true
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

// readPendingNow reads the permission requests at once, outside the
// poll: a permission event arrived, or an answer went out.
func (m *Model) readPendingNow() tea.Cmd {
	return func() tea.Msg {
		rep, err := m.src.Pending(m.ctx)
		return pendingMsg{PendingReply: rep, err: err, once: true}
	}
}

// unwrapped is the innermost of err's causes: "context deadline
// exceeded" rather than the chain of what was being read.
func unwrapped(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
