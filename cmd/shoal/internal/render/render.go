package render

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"unicode"

	"github.com/shoalfabric/shoal/schemas"
)

// DefaultWidth is the width one-line summaries are truncated to when
// Options.Width is zero.
const DefaultWidth = 100

// Options configure a Printer.
type Options struct {
	// Color turns on ANSI colours: dim thoughts and separators, bold tool
	// lines, red errors and failures. False writes plain text.
	Color bool
	// Width is the terminal width one-line summaries (tool calls, results,
	// separators…) are truncated to; streamed text is never truncated.
	// Zero means DefaultWidth; a negative width turns truncation off.
	Width int
	// ShowThoughts prints reasoning, dimmed, streamed like assistant text.
	// When false a thought block prints only a "💭 thinking…" marker.
	ShowThoughts bool
	// Prefix starts every line, streamed text included, with
	// "[agentID] ", for a tail that follows several agents at once.
	Prefix bool
	// Numbers starts every line with the number of the event it begins
	// with (set through EventNumbered), for resuming a tail from a point.
	Numbers bool
}

// Printer writes events for a person. Not safe for concurrent use.
//
// Each call to Event writes what the event renders to in one Write. A
// streamed line is left open (without its newline) until the text that
// follows or another line ends it; call Flush when the stream pauses for
// good or before writing anything else to the terminal.
type Printer struct {
	w     io.Writer
	o     Options
	width int // 0: no truncation
	buf   bytes.Buffer
	err   error // sticky write error

	// The open line: streamed text of one agent and kind written without
	// its newline yet.
	open      bool
	openAgent string
	openKind  streamKind

	agents map[string]*agent
	n      uint64 // the number of the event being rendered
}

type streamKind uint8

const (
	streamText streamKind = iota + 1
	streamThought
)

// agent is the per-agent state: the streamed blocks in progress and the
// tool calls of the current turn.
type agent struct {
	id      string
	text    block
	thought block
	calls   map[string]*call
	order   []string // call ids in the order first seen, for flushing
	// lastTool is the id of the call whose ▶ line is this agent's most
	// recent line, so its ↳ line needs no label.
	lastTool string
}

// block is a streamed text or thought block: the deltas received since the
// last authoritative copy.
type block struct {
	started bool
	sb      strings.Builder
}

func (b *block) reset() {
	b.started = false
	b.sb.Reset()
}

// New returns a Printer writing to w.
func New(w io.Writer, o Options) *Printer {
	width := o.Width
	switch {
	case width == 0:
		width = DefaultWidth
	case width < 0:
		width = 0
	}
	return &Printer{w: w, o: o, width: width, agents: map[string]*agent{}}
}

// Event renders one event of the agent agentID. It returns the first error
// the underlying writer reported; after one, nothing more is written.
// No event, however malformed, makes it panic.
func (p *Printer) Event(agentID string, ev schemas.Event) error {
	if p.err != nil {
		return p.err
	}
	p.buf.Reset()
	p.dispatch(agentID, ev)
	return p.writeOut()
}

// EventNumbered is Event for the agent's event number n, which starts the
// lines it begins when Options.Numbers is set.
func (p *Printer) EventNumbered(agentID string, n uint64, ev schemas.Event) error {
	p.n = n
	return p.Event(agentID, ev)
}

// Flush ends any open streamed line.
func (p *Printer) Flush() error {
	if p.err != nil {
		return p.err
	}
	p.buf.Reset()
	p.endLine()
	return p.writeOut()
}

func (p *Printer) writeOut() error {
	if p.buf.Len() == 0 {
		return nil
	}
	if _, err := p.w.Write(p.buf.Bytes()); err != nil {
		p.err = err
	}
	p.buf.Reset()
	return p.err
}

// dispatch renders ev into p.buf, turning a panic in rendering (a foreign
// Payload implementation, say) into a fallback line.
func (p *Printer) dispatch(agentID string, ev schemas.Event) {
	a := p.agent(agentID)
	defer func() {
		if r := recover(); r != nil {
			p.line(a, seg{text: fmt.Sprintf("· %s event (unrenderable: %v)", safeKind(ev.Payload), r), style: styleDim, flex: true})
		}
	}()
	switch pl := normalize(ev.Payload).(type) {
	case nil:
		p.fallback(a, nil)
	case schemas.AssistantText:
		p.text(a, streamText, pl.Delta, pl.Content)
	case schemas.Thought:
		p.thought(a, pl)
	case schemas.UserText:
		p.userText(a, pl.Content)
	case schemas.ToolUse:
		p.toolUse(a, pl.Call)
	case schemas.ToolInputDelta:
		// Liveness only: the authoritative tool_use carries the input.
	case schemas.ToolResult:
		p.toolResult(a, pl.Update)
	case schemas.Plan:
		p.plan(a, pl)
	case schemas.UsageUpdate:
		// Running totals; the turn's usage is printed when it ends.
	case schemas.TurnStarted:
		p.turnStarted(a, ev.Turn)
	case schemas.Result:
		p.result(a, ev.Turn, pl)
	case schemas.Error:
		p.error(a, pl)
	case schemas.Status:
		p.status(a, pl.Status)
	case schemas.Permission:
		p.permission(a, pl)
	default:
		p.fallback(a, ev.Payload)
	}
}

func (p *Printer) agent(id string) *agent {
	a := p.agents[id]
	if a == nil {
		a = &agent{id: id}
		p.agents[id] = a
	}
	return a
}

// normalize turns a pointer to a payload type into its value, the spelling
// schemas.Decode produces; a nil pointer becomes nil.
func normalize(pl schemas.Payload) schemas.Payload {
	switch v := pl.(type) {
	case *schemas.AssistantText:
		return deref(v)
	case *schemas.Thought:
		return deref(v)
	case *schemas.UserText:
		return deref(v)
	case *schemas.ToolUse:
		return deref(v)
	case *schemas.ToolResult:
		return deref(v)
	case *schemas.ToolInputDelta:
		return deref(v)
	case *schemas.Plan:
		return deref(v)
	case *schemas.UsageUpdate:
		return deref(v)
	case *schemas.TurnStarted:
		return deref(v)
	case *schemas.Result:
		return deref(v)
	case *schemas.Error:
		return deref(v)
	case *schemas.Status:
		return deref(v)
	case *schemas.Permission:
		return deref(v)
	}
	return pl
}

func deref[T schemas.Payload](v *T) schemas.Payload {
	if v == nil {
		return nil
	}
	return *v
}

// safeKind names a payload's kind without trusting its Kind method.
func safeKind(pl schemas.Payload) (k string) {
	defer func() {
		if recover() != nil {
			k = fmt.Sprintf("%T", pl)
		}
	}()
	if pl == nil {
		return "empty event"
	}
	if k = string(pl.Kind()); k == "" {
		k = fmt.Sprintf("%T", pl)
	}
	return k
}

// --- streamed text -------------------------------------------------------

func (a *agent) block(k streamKind) *block {
	if k == streamThought {
		return &a.thought
	}
	return &a.text
}

// text renders assistant text or a shown thought: deltas flow onto the
// current line, the authoritative copy completes the block.
func (p *Printer) text(a *agent, k streamKind, delta bool, c schemas.ContentBlock) {
	b := a.block(k)
	if !isText(c) {
		// An image or other non-text block is not streamed: one line.
		if !delta {
			b.reset()
		}
		p.line(a, seg{text: blockSummary(c), style: streamStyle(k), flex: true})
		return
	}
	if delta {
		b.started = true
		b.sb.WriteString(c.Text)
		p.stream(a, k, c.Text)
		return
	}
	streamed, started := b.sb.String(), b.started
	b.reset()
	auth := c.Text
	switch {
	case !started:
		p.stream(a, k, auth) // a backend that does not stream
	case strings.HasPrefix(auth, streamed):
		p.stream(a, k, auth[len(streamed):]) // nothing, or what was dropped
	case auth == "" || trimRight(auth) == trimRight(streamed):
		// Only trailing whitespace differs (or the copy is empty).
	default:
		// A chunk went missing mid-stream: the complete copy is truth.
		p.line(a, seg{text: "⚠ stream out of sync; full text follows", style: styleWarn})
		p.stream(a, k, auth)
	}
	p.endStream(a, k)
}

func trimRight(s string) string { return strings.TrimRightFunc(s, unicode.IsSpace) }

func isText(c schemas.ContentBlock) bool {
	return c.Type == schemas.ContentText || c.Type == ""
}

func streamStyle(k streamKind) string {
	if k == streamThought {
		return styleDim
	}
	return ""
}

func (p *Printer) thought(a *agent, t schemas.Thought) {
	if p.o.ShowThoughts {
		p.text(a, streamThought, t.Delta, t.Content)
		return
	}
	b := &a.thought
	if !b.started {
		p.line(a, seg{text: "💭 thinking…", style: styleDim})
	}
	if t.Delta {
		b.started = true
	} else {
		b.reset()
	}
}

// stream writes streamed text of agent a, prefixing each new line, after
// ending whichever other stream has its line open.
func (p *Printer) stream(a *agent, k streamKind, s string) {
	s = cleanStream(s)
	if s == "" {
		return
	}
	if p.open && (p.openAgent != a.id || p.openKind != k) {
		p.endLine()
	}
	a.lastTool = ""
	style := streamStyle(k)
	for s != "" {
		var part string
		i := strings.IndexByte(s, '\n')
		nl := i >= 0
		if nl {
			part, s = s[:i], s[i+1:]
		} else {
			part, s = s, ""
		}
		if !p.open {
			p.prefix(a, part == "")
		}
		p.styled(style, part)
		if nl {
			p.buf.WriteByte('\n')
			p.open = false
		} else {
			p.open, p.openAgent, p.openKind = true, a.id, k
		}
	}
}

// endStream ends the line of a's stream k if it is open.
func (p *Printer) endStream(a *agent, k streamKind) {
	if p.open && p.openAgent == a.id && p.openKind == k {
		p.endLine()
	}
}

func (p *Printer) endLine() {
	if p.open {
		p.buf.WriteByte('\n')
		p.open = false
	}
}

// --- lines -----------------------------------------------------------------

// ANSI SGR parameters.
const (
	styleDim    = "2"
	styleBold   = "1"
	styleTool   = "1;36"
	styleOK     = "32"
	styleFail   = "1;31"
	styleError  = "31"
	styleWarn   = "33"
	styleUser   = "1;35"
	styleAccent = "1"
)

// seg is a piece of a line. Flex pieces are truncated, last first, when
// the line is wider than the terminal.
type seg struct {
	text  string
	style string
	flex  bool
}

// line writes one whole line for agent a, ending any open streamed line.
func (p *Printer) line(a *agent, segs ...seg) {
	p.endLine()
	a.lastTool = ""
	if p.width > 0 {
		over := p.prefixWidth(a) - p.width
		for _, s := range segs {
			over += width(s.text)
		}
		for i := len(segs) - 1; i >= 0 && over > 0; i-- {
			if !segs[i].flex {
				continue
			}
			w := width(segs[i].text)
			if w <= over {
				segs[i].text = ""
				over -= w
				continue
			}
			segs[i].text = truncate(segs[i].text, w-over)
			over -= w - width(segs[i].text)
		}
	}
	// No trailing blanks: drop them from the last piece with text.
	empty := true
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].text = strings.TrimRight(segs[i].text, " "); segs[i].text != "" {
			empty = false
			break
		}
	}
	p.prefix(a, empty)
	for _, s := range segs {
		p.styled(s.style, s.text)
	}
	p.buf.WriteByte('\n')
}

func (p *Printer) styled(style, s string) {
	if s == "" {
		return
	}
	if !p.o.Color || style == "" {
		p.buf.WriteString(s)
		return
	}
	p.buf.WriteString("\x1b[")
	p.buf.WriteString(style)
	p.buf.WriteByte('m')
	p.buf.WriteString(s)
	p.buf.WriteString("\x1b[0m")
}

// prefix writes "[agentID] " when Options.Prefix is set; bare drops the
// space, for an empty line.
func (p *Printer) prefix(a *agent, bare bool) {
	if p.o.Prefix {
		p.styled(agentStyle(a.id), "["+cleanLine(a.id)+"]")
		if !bare || p.o.Numbers {
			p.buf.WriteByte(' ')
		}
	}
	if p.o.Numbers {
		p.styled(styleDim, fmt.Sprintf("%6d", p.n))
		if !bare {
			p.buf.WriteByte(' ')
		}
	}
}

func (p *Printer) prefixWidth(a *agent) int {
	w := 0
	if p.o.Prefix {
		w += width(cleanLine(a.id)) + 3
	}
	if p.o.Numbers {
		w += len(fmt.Sprintf("%6d", p.n)) + 1
	}
	return w
}

var agentStyles = []string{"36", "35", "34", "33", "32", "96", "95", "94", "93", "92"}

// agentStyle gives each agent id a stable colour.
func agentStyle(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return agentStyles[h.Sum32()%uint32(len(agentStyles))]
}
