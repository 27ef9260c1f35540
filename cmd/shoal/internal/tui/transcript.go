package tui

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// transcript is an agent's whole story as the transcript view shows it:
// one entry per event a reader wants (a tool call with its result as
// one), each wrapped to the width, oldest at the top; it follows the
// newest at the bottom while events arrive, unless the user has scrolled
// up. A tool's entry expands to its input and whole result.
type transcript struct {
	agent   string
	loading bool
	early   []Event // what arrived live before the stored events did

	entries   []tentry
	tools     map[string]int // tool call id → entry
	streaming int            // the entry of the text being streamed, -1 when none
	last      uint64         // the number of the last event taken

	width  int // what lines were wrapped to
	lines  []vline
	spans  []span // each entry's lines
	dirty  bool
	top    int  // the first line shown
	sel    int  // the selected entry
	follow bool // the newest line is the last shown
}

// tentry is one entry of a transcript.
type tentry struct {
	kind     string   // as a feed line's
	text     string   // may hold newlines
	detail   []string // what expanding shows beneath it
	expanded bool
	wrapped  []string // text and, expanded, detail, wrapped at wrapW
	wrapW    int
}

type vline struct {
	entry int
	text  string
	first bool // the entry's first line
}

type span struct{ from, to int }

func newTranscript(agent string) *transcript {
	return &transcript{agent: agent, loading: true, tools: map[string]int{}, streaming: -1, follow: true, dirty: true}
}

// load takes the agent's stored events, then what arrived meanwhile.
func (t *transcript) load(evs []Event) {
	early := t.early
	*t = transcript{agent: t.agent, tools: map[string]int{}, streaming: -1, follow: true, dirty: true}
	for _, ev := range evs {
		t.add(ev)
	}
	for _, ev := range early {
		t.add(ev)
	}
}

// add takes one event, unless it has had it already.
func (t *transcript) add(e Event) {
	if t.loading {
		t.early = append(t.early, e)
		return
	}
	if e.N > 0 {
		if e.N <= t.last {
			return
		}
		t.last = e.N
	}
	t.dirty = true
	ev := e.Event
	switch p := ev.Payload.(type) {
	case schemas.UserText:
		t.push(tentry{kind: "user", text: "» " + p.Content.Text})
	case schemas.TurnStarted:
		t.push(tentry{kind: "turn", text: fmt.Sprintf("── turn %d ──", ev.Turn)})
	case schemas.AssistantText:
		if p.Delta {
			if t.streaming < 0 {
				t.streaming = t.push(tentry{kind: "stream"})
			}
			t.set(t.streaming, tentry{kind: "stream", text: t.entries[t.streaming].text + p.Content.Text})
			return
		}
		if t.streaming >= 0 {
			t.set(t.streaming, tentry{kind: "text", text: p.Content.Text})
			t.streaming = -1
			return
		}
		t.push(tentry{kind: "text", text: p.Content.Text})
	case schemas.Thought:
		if !p.Delta {
			t.push(tentry{kind: "thought", text: "✻ " + p.Content.Text})
		}
	case schemas.ToolUse:
		e := tentry{kind: "tool", text: "▶ " + toolTitle(p.Call.Title, p.Call.Kind, p.Call.RawInput), detail: toolInput(p.Call.RawInput)}
		if i, ok := t.tools[p.Call.ToolCallID]; ok {
			e.expanded = t.entries[i].expanded
			t.set(i, e)
			return
		}
		t.tools[p.Call.ToolCallID] = t.push(e)
	case schemas.ToolResult:
		i, ok := t.tools[p.Update.ToolCallID]
		if !ok {
			i = t.push(tentry{kind: "tool", text: "▶ " + p.Update.ToolCallID})
			t.tools[p.Update.ToolCallID] = i
		}
		e := t.entries[i]
		head, _, _ := strings.Cut(e.text, " → ")
		if p.Update.Title != nil && *p.Update.Title != "" {
			head = "▶ " + oneLine(*p.Update.Title)
		}
		status := "…"
		if p.Update.Status != nil {
			status = string(*p.Update.Status)
		}
		out := toolOutput(p.Update)
		first := ""
		if len(out) > 0 {
			first = ": " + oneLine(out[0])
		}
		input, _, _ := cutResult(e.detail)
		if len(p.Update.RawInput) > 0 {
			input = toolInput(p.Update.RawInput)
		}
		detail := input
		if len(out) > 0 {
			detail = append(append(append([]string(nil), input...), "result:"), out...)
		}
		t.set(i, tentry{kind: "tool", text: head + " → " + status + first, detail: detail, expanded: e.expanded})
	case schemas.Result:
		text := fmt.Sprintf("── turn %d ended: %s", ev.Turn, p.StopReason)
		if p.Usage != nil {
			text += fmt.Sprintf(" · %d in / %d out", p.Usage.InputTokens, p.Usage.OutputTokens)
		}
		t.streaming = -1
		t.push(tentry{kind: "turn", text: text + " ──"})
	case schemas.Error:
		t.push(tentry{kind: "error", text: "✖ " + p.Message})
	case schemas.Permission:
		var opts []string
		for _, o := range p.Options {
			opts = append(opts, o.Name)
		}
		t.push(tentry{kind: "permission", text: "? permission for " + p.ToolCall.ToolCallID + " (" + strings.Join(opts, ", ") + ")"})
	case schemas.Status:
		if p.Status == schemas.StatusDead || p.Status == schemas.StatusClosed {
			t.push(tentry{kind: "status", text: "· " + string(p.Status)})
		}
	case schemas.Plan:
		e := tentry{kind: "plan", text: fmt.Sprintf("☰ plan: %d steps", len(p.Entries))}
		for _, s := range p.Entries {
			e.detail = append(e.detail, fmt.Sprintf("[%s] %s", s.Status, s.Content))
		}
		t.push(e)
	}
}

// cutResult splits a tool's detail into its input and its result.
func cutResult(detail []string) (input, result []string, found bool) {
	for i, l := range detail {
		if l == "result:" {
			return detail[:i], detail[i+1:], true
		}
	}
	return detail, nil, false
}

func (t *transcript) push(e tentry) int {
	t.entries = append(t.entries, e)
	return len(t.entries) - 1
}

func (t *transcript) set(i int, e tentry) {
	t.entries[i] = e
	t.dirty = true
}

// toolTitle is a tool call's title with what it is about.
func toolTitle(title string, kind schemas.ToolKind, raw []byte) string {
	if title == "" {
		title = string(kind)
	}
	if hint := toolHint(raw); hint != "" && !strings.Contains(title, hint) {
		title += " " + hint
	}
	return oneLine(title)
}

// toolInput is a tool's input, pretty-printed, as detail lines.
func toolInput(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	return append([]string{"input:"}, prettyJSON(raw)...)
}

// prettyJSON is raw indented, or as it is when it is not JSON.
func prettyJSON(raw []byte) []string {
	return strings.Split(strings.TrimRight(schemas.Readable(raw, true), "\n"), "\n")
}

// toolOutput is a tool result's whole content, as lines.
func toolOutput(u schemas.ToolCallUpdate) []string {
	var out []string
	for _, c := range u.Content {
		switch {
		case c.Path != "":
			out = append(out, "diff "+c.Path)
			out = append(out, strings.Split(strings.TrimRight(c.NewText, "\n"), "\n")...)
		case c.TerminalID != "":
			out = append(out, "terminal "+c.TerminalID)
		case c.Content.Text != "":
			out = append(out, strings.Split(strings.TrimRight(c.Content.Text, "\n"), "\n")...)
		}
	}
	if len(out) == 0 && len(u.RawOutput) > 0 {
		out = prettyJSON(u.RawOutput)
	}
	return out
}

// gutter is how wide the markers before each line are: the selection
// and whether an entry expands.
const gutter = 2

// layout wraps every entry to width w, reusing what has not changed.
func (t *transcript) layout(w int) {
	w = max(8, w-gutter)
	if !t.dirty && t.width == w {
		return
	}
	t.width, t.dirty = w, false
	t.lines, t.spans = t.lines[:0], t.spans[:0]
	for i := range t.entries {
		e := &t.entries[i]
		if e.wrapped == nil || e.wrapW != w {
			e.wrapped, e.wrapW = e.wrap(w), w
		}
		s := span{from: len(t.lines)}
		for j, l := range e.wrapped {
			t.lines = append(t.lines, vline{entry: i, text: l, first: j == 0})
		}
		s.to = len(t.lines)
		t.spans = append(t.spans, s)
	}
}

// wrap is the entry's lines at width w.
func (e *tentry) wrap(w int) []string {
	text := e.text
	if e.kind == "stream" {
		text += " …"
	}
	out := wrapText(text, w)
	if e.expanded {
		for _, d := range e.detail {
			for _, l := range wrapText(d, w-2) {
				out = append(out, "  "+l)
			}
		}
	}
	return out
}

// wrapText breaks text into lines of at most w cells, at spaces where it
// can, within words where it must.
func wrapText(text string, w int) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(render.Clean(text), "\n"), "\n") {
		l = strings.ReplaceAll(l, "\t", "    ")
		if ansi.StringWidth(l) <= w {
			out = append(out, l)
			continue
		}
		for _, part := range strings.Split(ansi.Wrap(l, w, ""), "\n") {
			out = append(out, strings.TrimRight(part, " "))
		}
	}
	return out
}

// settle keeps the view within the lines for h rows and, while it
// follows, at the bottom with the newest entry selected.
func (t *transcript) settle(w, h int) {
	t.layout(w)
	bottom := max(0, len(t.lines)-h)
	if t.follow {
		t.top, t.sel = bottom, len(t.entries)-1
	}
	t.top = max(0, min(t.top, bottom))
	t.sel = max(0, min(t.sel, len(t.entries)-1))
}

// scroll moves the view by d lines, keeping the selection on screen.
func (t *transcript) scroll(d, h int) {
	t.follow = false
	bottom := max(0, len(t.lines)-h)
	t.top = max(0, min(t.top+d, bottom))
	if t.top == bottom && d > 0 {
		t.follow = true
		return
	}
	if len(t.spans) == 0 {
		return
	}
	if s := t.spans[t.sel]; s.to <= t.top || s.from >= t.top+h {
		t.sel = t.lines[t.top].entry
	}
}

// down moves to the next entry, or, when the selected one goes on below
// the screen, down one line within it.
func (t *transcript) down(h int) {
	if len(t.spans) == 0 {
		return
	}
	t.follow = false
	if s := t.spans[t.sel]; s.to > t.top+h {
		t.top++
	} else if t.sel < len(t.entries)-1 {
		t.sel++
		if s := t.spans[t.sel]; s.to > t.top+h {
			t.top = min(s.from, s.to-h)
		}
	}
	if t.sel == len(t.entries)-1 && t.top >= len(t.lines)-h {
		t.follow = true
	}
}

// up moves to the previous entry, or, when the selected one starts above
// the screen, up one line within it.
func (t *transcript) up(h int) {
	if len(t.spans) == 0 {
		return
	}
	t.follow = false
	if s := t.spans[t.sel]; s.from < t.top {
		t.top--
	} else if t.sel > 0 {
		t.sel--
		if s := t.spans[t.sel]; s.from < t.top {
			t.top = max(s.from, s.to-h)
		}
	}
}

// toggle expands or folds the selected entry, and says whether it can.
func (t *transcript) toggle() bool {
	if t.sel >= len(t.entries) || len(t.entries[t.sel].detail) == 0 {
		return false
	}
	e := &t.entries[t.sel]
	e.expanded, e.wrapped = !e.expanded, nil
	t.dirty = true
	return true
}

// reveal scrolls so that as much of the selected entry as fits is shown.
func (t *transcript) reveal(h int) {
	if t.follow || t.sel >= len(t.spans) {
		return
	}
	s := t.spans[t.sel]
	if s.to > t.top+h {
		t.top = min(s.from, s.to-h)
	}
	if s.from < t.top {
		t.top = s.from
	}
}

// at selects the entry on line top+y.
func (t *transcript) at(y int) {
	if i := t.top + y; i >= 0 && i < len(t.lines) {
		t.sel, t.follow = t.lines[i].entry, false
	}
}
