package bridge

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// OutputFromStream answers agent_output from the agent's events in the
// stream, so it answers after the agent's node is gone. The agent's
// current life starts at its last open (status idle at turn 0).
func (f *Fabric) OutputFromStream(ctx context.Context, req schemas.OutputRequest) (schemas.OutputReply, error) {
	if f.remote {
		var rep schemas.OutputReply
		return rep, f.viaCoordinator(ctx, "output", req, &rep, 0)
	}
	which := req.Which
	if which == "" {
		which = schemas.WhichLastMessage
	}
	maxChars := 20000
	if req.MaxChars != nil {
		if *req.MaxChars < 0 {
			return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "max_chars must not be negative")
		}
		maxChars = *req.MaxChars
	}
	if req.Turn != nil && *req.Turn < 0 {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "turn must not be negative")
	}
	rec, _, err := f.Record(ctx, req.AgentID)
	if err != nil {
		return schemas.OutputReply{}, err
	}
	life, err := f.readLife(ctx, req.AgentID)
	if err != nil {
		return schemas.OutputReply{}, err
	}
	current := rec.Turn
	working := rec.Status == schemas.StatusWorking
	for t := range life.turns {
		current = max(current, t)
	}
	target := current
	if req.Turn != nil {
		target = *req.Turn
		if f := life.first; f.N > 0 && !life.whole && target > 0 && (life.started == 0 || target < life.started) {
			whole := "holds no whole turn"
			if life.started > 0 {
				whole = fmt.Sprintf("turn %d is the first it holds whole", life.started)
			}
			return schemas.OutputReply{}, schemas.Errf(schemas.CodeNotFound,
				"turn %d of agent %s is past the stream's retention; its stored history now starts at event %d, and %s", target, req.AgentID, f.N, whole)
		}
	}
	live := working && target >= current
	out := schemas.OutputReply{AgentID: req.AgentID, Turn: target, Status: rec.Status, Done: !live, Which: which}
	if rec.Status != schemas.StatusDead {
		u := rec.Usage
		out.Usage = &u
	}
	var text string
	switch {
	case which == schemas.WhichAll:
		var parts []string
		for t := 1; t <= current; t++ {
			body := strings.Join(life.lines(t, req.IncludeTools), "\n\n")
			if working && t == current {
				body = life.partial[t]
			}
			if strings.TrimSpace(body) != "" {
				parts = append(parts, fmt.Sprintf("— turn %d —\n\n%s", t, body))
			}
		}
		text = strings.Join(parts, "\n\n")
	case live && target == current:
		text = life.partial[target]
	case which == schemas.WhichFullTurn:
		text = strings.Join(life.lines(target, req.IncludeTools), "\n\n")
	default:
		if texts := life.lines(target, false); len(texts) > 0 {
			text = texts[len(texts)-1]
		}
	}
	if n := utf8.RuneCountInString(text); n > maxChars {
		text = string([]rune(text)[:maxChars])
		out.Truncated, out.DroppedChars = true, n-maxChars
	}
	out.Text = text
	return out, nil
}

// life is what agent_output needs of one life of an agent.
type life struct {
	first   Replayed // the oldest event the stream still has
	whole   bool     // the stream still has this life's beginning
	started int      // the first turn whose start the stream still has
	turns   map[int]*turnLog
	partial map[int]string  // each turn's streamed text
	calls   map[string]bool // tool calls already given a line
}

type turnLog struct {
	texts []string // authoritative assistant texts
	lines []string // the same with tool lines, for include_tools
}

func (l *life) lines(turn int, tools bool) []string {
	t := l.turns[turn]
	if t == nil {
		return nil
	}
	if tools {
		return t.lines
	}
	return t.texts
}

func newLife() *life {
	return &life{turns: map[int]*turnLog{}, partial: map[int]string{}, calls: map[string]bool{}}
}

// readLife reads an agent's events from the stream up to the last one
// stored now.
func (f *Fabric) readLife(ctx context.Context, id string) (*life, error) {
	l := newLife()
	var first Replayed
	err := f.Replay(ctx, []string{id}, From{}, false, func(r Replayed, _ *Gap) error {
		if first.N == 0 {
			first = r
			l.whole = r.N == 1
		}
		if ev, err := r.Event(); err == nil {
			l.add(ev)
		}
		return nil
	})
	l.first = first
	if err != nil {
		return nil, err
	}
	return l, nil
}

// add folds one event in.
func (l *life) add(ev schemas.Event) {
	turn := func() *turnLog {
		t := l.turns[ev.Turn]
		if t == nil {
			t = &turnLog{}
			l.turns[ev.Turn] = t
		}
		return t
	}
	switch p := ev.Payload.(type) {
	case schemas.TurnStarted:
		if l.started == 0 || ev.Turn < l.started {
			l.started = ev.Turn
		}
	case schemas.Status:
		if p.Status == schemas.StatusIdle && ev.Turn == 0 {
			*l = *newLife() // a new life of the id, from its beginning
			l.whole = true
		}
	case schemas.AssistantText:
		if p.Content.Type != schemas.ContentText {
			break
		}
		if p.Delta {
			l.partial[ev.Turn] += p.Content.Text
			break
		}
		t := turn()
		t.texts = append(t.texts, p.Content.Text)
		t.lines = append(t.lines, p.Content.Text)
	case schemas.ToolUse:
		if l.calls[p.Call.ToolCallID] {
			break // the authoritative copy of a streamed call
		}
		l.calls[p.Call.ToolCallID] = true
		t := turn()
		t.lines = append(t.lines, fmt.Sprintf("→ tool: %s (%s)", p.Call.Title, p.Call.Kind))
	case schemas.ToolResult:
		if p.Update.Status != nil {
			t := turn()
			t.lines = append(t.lines, "← result: "+string(*p.Update.Status))
		}
	}
}
