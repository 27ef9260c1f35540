package tui

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/render"
	"github.com/shoalfabric/shoal/schemas"
)

// maxFeed is how many lines an agent's feed keeps.
const maxFeed = 400

// line is one line of an agent's feed.
type line struct {
	kind string // user, turn, text, thought, tool, error, permission, status, plan, stream
	text string
	ev   schemas.Event // the event it shows; a tool line's latest
	at   time.Time
}

// feed is what the monitor knows of one agent's events: one line per
// event worth a line, a tool call and its result on one line, the text
// being streamed on one line until its authoritative copy arrives.
type feed struct {
	lines        []line
	dropped      int            // lines dropped from the front: lines[i] is line dropped+i
	tools        map[string]int // tool call id → index in lines
	streaming    int            // index of the streaming line, -1 when none
	streamed     string         // the end of the text being streamed
	last         uint64         // the number of the last event taken
	lastActivity time.Time
	backfilled   bool
	// loading is set while the stored events are read; early holds what
	// arrives live meanwhile, to add after them.
	loading bool
	early   []incoming
}

func newFeed() *feed { return &feed{tools: map[string]int{}, streaming: -1} }

// take adds an event the follower received.
func (f *feed) take(in incoming) {
	if f.loading && len(f.early) < maxFeed {
		f.early = append(f.early, in)
	}
	f.add(in.ev, in.at)
}

// add takes one event, unless it has had it already.
func (f *feed) add(e Event, at time.Time) {
	if e.N > 0 {
		if e.N <= f.last {
			return
		}
		f.last = e.N
	}
	f.lastActivity = at
	ev := e.Event
	switch p := ev.Payload.(type) {
	case schemas.UserText:
		f.push(line{kind: "user", text: "» " + oneLine(p.Content.Text), ev: ev})
	case schemas.TurnStarted:
		f.push(line{kind: "turn", text: fmt.Sprintf("── turn %d ──", ev.Turn), ev: ev})
	case schemas.AssistantText:
		if p.Delta {
			f.stream(ev, p.Content.Text)
			return
		}
		f.settle(line{kind: "text", text: oneLine(p.Content.Text), ev: ev})
	case schemas.Thought:
		if p.Delta {
			return
		}
		f.push(line{kind: "thought", text: "✻ " + oneLine(p.Content.Text), ev: ev})
	case schemas.ToolUse:
		title := p.Call.Title
		if title == "" {
			title = string(p.Call.Kind)
		}
		if hint := toolHint(p.Call.RawInput); hint != "" && !strings.Contains(title, hint) {
			title += " " + hint
		}
		l := line{kind: "tool", text: "▶ " + oneLine(title), ev: ev}
		if i, ok := f.tools[p.Call.ToolCallID]; ok {
			l.text = f.lines[i].text
			if !strings.Contains(l.text, " → ") {
				l.text = "▶ " + oneLine(title)
			}
			f.lines[i] = l
			return
		}
		f.tools[p.Call.ToolCallID] = f.push(l)
	case schemas.ToolResult:
		i, ok := f.tools[p.Update.ToolCallID]
		if !ok {
			i = f.push(line{kind: "tool", text: "▶ " + p.Update.ToolCallID, ev: ev})
			f.tools[p.Update.ToolCallID] = i
		}
		head := f.lines[i].text
		if j := strings.Index(head, " → "); j >= 0 {
			head = head[:j]
		}
		if p.Update.Title != nil && *p.Update.Title != "" {
			head = "▶ " + oneLine(*p.Update.Title)
		}
		status := "…"
		if p.Update.Status != nil {
			status = string(*p.Update.Status)
		}
		out := ""
		for _, c := range p.Update.Content {
			if t := oneLine(c.Content.Text); t != "" {
				out = ": " + t
				break
			}
		}
		f.lines[i] = line{kind: "tool", text: head + " → " + status + out, ev: ev, at: f.lines[i].at}
	case schemas.Result:
		text := fmt.Sprintf("── turn %d ended: %s", ev.Turn, p.StopReason)
		if p.Usage != nil {
			text += fmt.Sprintf(" · %d in / %d out", p.Usage.InputTokens, p.Usage.OutputTokens)
		}
		f.settle(line{kind: "turn", text: text + " ──", ev: ev})
	case schemas.Error:
		f.push(line{kind: "error", text: "✖ " + oneLine(p.Message), ev: ev})
	case schemas.Permission:
		// Named by the request's id, which p and shoal permit take.
		what := p.Tool
		if hint := toolHint(p.Input); hint != "" {
			what += " " + hint
		}
		if what == "" {
			what = p.ToolCall.ToolCallID
		}
		if a := p.Answer; a != nil {
			text := "✓ " + p.RequestID + " allowed by " + a.By
			if a.Decision == schemas.DecisionDeny {
				text = "✗ " + p.RequestID + " denied by " + a.By
			}
			if a.Message != "" {
				text += ": " + a.Message
			}
			f.push(line{kind: "permission", text: oneLine(text), ev: ev})
			return
		}
		var opts []string
		for _, o := range p.Options {
			opts = append(opts, o.Name)
		}
		text := "? " + p.RequestID + " asks: " + what
		if len(opts) > 0 {
			text += " (" + strings.Join(opts, ", ") + ")"
		}
		f.push(line{kind: "permission", text: oneLine(text), ev: ev})
	case schemas.Status:
		if p.Status == schemas.StatusDead || p.Status == schemas.StatusClosed {
			f.push(line{kind: "status", text: "· " + string(p.Status), ev: ev})
		}
	case schemas.Plan:
		f.push(line{kind: "plan", text: fmt.Sprintf("☰ plan: %d steps", len(p.Entries)), ev: ev})
	}
}

// toolHint is what a tool call is about, from its input: a command, a
// path, a pattern, a URL.
func toolHint(raw []byte) string {
	var in map[string]any
	if json.Unmarshal(raw, &in) != nil {
		return ""
	}
	for _, k := range []string{"command", "file_path", "filePath", "path", "pattern", "url", "query"} {
		if v, ok := in[k].(string); ok && v != "" {
			return v
		}
	}
	return ""
}

// push appends a line and returns its index.
func (f *feed) push(l line) int {
	if l.at.IsZero() {
		l.at = f.lastActivity
	}
	f.lines = append(f.lines, l)
	if len(f.lines) > maxFeed {
		drop := len(f.lines) - maxFeed
		f.dropped += drop
		f.lines = append(f.lines[:0], f.lines[drop:]...)
		for id, i := range f.tools {
			if i -= drop; i < 0 {
				delete(f.tools, id)
			} else {
				f.tools[id] = i
			}
		}
		if f.streaming >= 0 {
			if f.streaming -= drop; f.streaming < 0 {
				f.streaming = -1
			}
		}
	}
	return len(f.lines) - 1
}

// stream grows the line of the text being streamed.
func (f *feed) stream(ev schemas.Event, chunk string) {
	if f.streaming < 0 {
		f.streaming = f.push(line{kind: "stream", ev: ev})
		f.streamed = ""
	}
	f.streamed += chunk
	if len(f.streamed) > 2048 {
		f.streamed = f.streamed[len(f.streamed)-1024:]
	}
	f.lines[f.streaming].ev = ev // its text is made when it is shown
}

// text is what a line shows.
func (f *feed) text(i int) string {
	if i == f.streaming {
		return tail(strings.Join(strings.Fields(f.streamed), " "), 200)
	}
	return f.lines[i].text
}

// tail is the last n runes of s, marked when cut.
func tail(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return "…" + string(r[len(r)-n+1:])
	}
	return s
}

// settle replaces the streaming line, if any, with l.
func (f *feed) settle(l line) {
	if f.streaming >= 0 {
		l.at = f.lines[f.streaming].at
		f.lines[f.streaming] = l
		f.streaming = -1
		return
	}
	f.push(l)
}

// oneLine flattens text to one line of at most 200 runes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(render.Clean(s)), " ")
	if r := []rune(s); len(r) > 200 {
		return string(r[:199]) + "…"
	}
	return s
}
