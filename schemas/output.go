package schemas

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Stored is an agent's history as the stream holds it, folded for
// agent_output: every life of its id, whose turn numbers never repeat (a
// reopened id goes on from its previous life's last turn).
type Stored struct {
	// First is the number of the oldest event the stream still holds; 1
	// when it holds them all, 0 when it holds none.
	First uint64
	// Whole is the first turn whose beginning the stream holds when the
	// oldest events are gone (0: none, or all are whole).
	Whole int
	// Last is the highest turn number seen.
	Last int
	// Dropped says, when the stream holds none of the agent's events,
	// that it dropped them: the record numbers events the stream does not
	// hold yet while they are on their way, so holding none is not
	// enough to say they are gone.
	Dropped bool
	// Usage is what the id's last life has used, from its results.
	Usage  Usage
	ended  bool        // the last event seen was a status dead: a later one begins a new life
	status AgentStatus // the last status event's
	turns  map[int]*storedTurn
	calls  map[string]bool // tool calls already given a line
}

type storedTurn struct {
	texts   []string // authoritative assistant texts
	lines   []string // the same with tool lines, for include_tools
	partial strings.Builder
	started bool
	done    bool // its result is stored
}

// NewStored starts the history of an agent whose oldest stored event is
// number first.
func NewStored(first uint64) *Stored {
	return &Stored{First: first, turns: map[int]*storedTurn{}, calls: map[string]bool{}}
}

// Add folds in the next stored event.
func (s *Stored) Add(ev Event) {
	if s.ended {
		s.ended, s.Usage = false, Usage{}
	}
	turn := func() *storedTurn {
		t := s.turns[ev.Turn]
		if t == nil {
			t = &storedTurn{}
			s.turns[ev.Turn] = t
		}
		return t
	}
	switch p := ev.Payload.(type) {
	case Status:
		s.ended, s.status = p.Status == StatusDead, p.Status
	case Result:
		if p.Usage != nil {
			s.Usage.Add(*p.Usage)
		}
		turn().done = true
	case TurnStarted:
		turn().started = true
		if s.First > 1 && s.Whole == 0 {
			s.Whole = ev.Turn
		}
		s.Last = max(s.Last, ev.Turn)
	case AssistantText:
		if p.Content.Type != ContentText {
			break
		}
		t := turn()
		if p.Delta {
			t.partial.WriteString(p.Content.Text)
			break
		}
		t.texts = append(t.texts, p.Content.Text)
		t.lines = append(t.lines, p.Content.Text)
	case ToolUse:
		if s.calls[p.Call.ToolCallID] {
			break // the authoritative copy of a streamed call
		}
		s.calls[p.Call.ToolCallID] = true
		t := turn()
		t.lines = append(t.lines, fmt.Sprintf("→ tool: %s (%s)", p.Call.Title, p.Call.Kind))
	case ToolResult:
		if p.Update.Status != nil {
			t := turn()
			t.lines = append(t.lines, "← result: "+string(*p.Update.Status))
		}
	}
}

func (s *Stored) lines(turn int, tools bool) []string {
	t := s.turns[turn]
	if t == nil {
		return nil
	}
	if tools {
		return t.lines
	}
	return t.texts
}

// OutputOf answers agent_output (Kaimon's algorithm) from an agent's
// stored history and its record; rec is nil when the fabric keeps no
// record of it (a dead agent pruned from those kept), which then reads as
// dead. A turn that does not exist, or whose start is past the stream's
// retention, is not found.
func OutputOf(s *Stored, rec *AgentRecord, req OutputRequest) (OutputReply, error) {
	which := req.Which
	if which == "" {
		which = WhichLastMessage
	}
	if which != WhichLastMessage && which != WhichFullTurn && which != WhichAll {
		return OutputReply{}, Errf(CodeInvalid, "which must be last_message, full_turn or all, not %q", which)
	}
	maxChars := DefaultMaxChars
	if req.MaxChars != nil {
		if *req.MaxChars < 0 {
			return OutputReply{}, Errf(CodeInvalid, "max_chars must not be negative")
		}
		maxChars = *req.MaxChars
	}
	if req.Turn != nil && *req.Turn < 0 {
		return OutputReply{}, Errf(CodeInvalid, "turn must not be negative")
	}
	status, current := StatusDead, s.Last
	if rec != nil {
		status, current = rec.Status, max(current, rec.Turn)
	}
	// A record is written after the events it sums up are stored: one
	// that says working at a turn whose result the stream holds lags it,
	// and the agent is as its last status event says.
	if t := s.turns[current]; status == StatusWorking && t != nil && t.done && s.status != "" && s.status != StatusWorking {
		status = s.status
	}
	working := status == StatusWorking
	target := current
	if req.Turn != nil {
		target = *req.Turn
		if (target != 0 || current != 0) && (target < 1 || target > current) {
			what := "has no turns yet"
			if current > 0 {
				what = fmt.Sprintf("has turns 1 to %d", current)
			}
			return OutputReply{}, Errf(CodeNotFound, "agent %s has no turn %d (it %s)", req.AgentID, target, what)
		}
	}
	// A turn the stream no longer holds is said to be gone, whether it
	// was named or is the last one (a caller asking with no turn would
	// read an empty text as the answer); all the turns are gone when the
	// stream holds none of the agent's events.
	gone := s.First == 0 && s.Dropped && rec != nil && rec.LastEvent > 0
	switch {
	case target == 0:
	case gone && which == WhichAll && req.Turn == nil:
		return OutputReply{}, Errf(CodeNotFound,
			"the turns of agent %s are past the stream's retention; the stream holds none of its %d events any more", req.AgentID, rec.LastEvent)
	case which == WhichAll && req.Turn == nil:
	case gone:
		return OutputReply{}, Errf(CodeNotFound,
			"turn %d of agent %s is past the stream's retention; the stream holds none of its %d events any more", target, req.AgentID, rec.LastEvent)
	case s.First > 1 && (s.Whole == 0 || target < s.Whole):
		whole := "holds no whole turn"
		if s.Whole > 0 {
			whole = fmt.Sprintf("turn %d is the first it holds whole", s.Whole)
		}
		return OutputReply{}, Errf(CodeNotFound,
			"turn %d of agent %s is past the stream's retention; its stored history now starts at event %d, and %s", target, req.AgentID, s.First, whole)
	}
	live := working && target >= current
	out := OutputReply{AgentID: req.AgentID, Turn: target, Status: status, Done: !live, Which: which}
	if rec != nil && status != StatusDead {
		u := rec.Usage
		out.Usage = &u
	}
	partial := func(turn int) string {
		if t := s.turns[turn]; t != nil {
			return t.partial.String()
		}
		return ""
	}
	var text string
	switch {
	case which == WhichAll:
		var parts []string
		first := 1
		if s.First > 1 {
			// The turns before the first the stream holds whole are
			// gone, or held in part: said, not left out silently.
			first = max(s.Whole, 1)
			if s.Whole == 0 {
				first = current // held in part, or being written
			}
			switch lost := first - 1; {
			case lost == 1:
				parts = append(parts, "— turn 1 is past the stream's retention —")
			case lost > 1:
				parts = append(parts, fmt.Sprintf("— turns 1 to %d are past the stream's retention —", lost))
			}
		}
		for t := first; t <= current; t++ {
			body := strings.Join(s.lines(t, req.IncludeTools), "\n\n")
			if working && t == current {
				body = partial(t)
			}
			if strings.TrimSpace(body) != "" {
				parts = append(parts, fmt.Sprintf("— turn %d —\n\n%s", t, body))
			}
		}
		text = strings.Join(parts, "\n\n")
	case live && target == current:
		text = partial(target)
	case which == WhichFullTurn:
		text = strings.Join(s.lines(target, req.IncludeTools), "\n\n")
	default:
		if texts := s.lines(target, false); len(texts) > 0 {
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
