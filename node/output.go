package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// DefaultMaxChars is agent_output's max_chars when the caller gives none.
const DefaultMaxChars = 20000

// Output reads an agent's output without blocking (agent_output), from its
// event log, so it answers for agents that are gone too; a turn still
// running shows its streamed text so far.
func (h *Host) Output(_ context.Context, req schemas.OutputRequest) (schemas.OutputReply, error) {
	if err := schemas.ValidID(req.AgentID); err != nil {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	which := req.Which
	if which == "" {
		which = schemas.WhichLastMessage
	}
	if which != schemas.WhichLastMessage && which != schemas.WhichFullTurn && which != schemas.WhichAll {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "which must be last_message, full_turn or all, not %q", which)
	}
	maxChars := DefaultMaxChars
	if req.MaxChars != nil {
		if *req.MaxChars < 0 {
			return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "max_chars must not be negative")
		}
		maxChars = *req.MaxChars
	}
	if req.Turn != nil && *req.Turn < 0 {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeInvalid, "turn must not be negative")
	}

	h.mu.Lock()
	a := h.agents[req.AgentID]
	h.mu.Unlock()
	recs, err := readLog(filepath.Join(h.cfg.Dir, req.AgentID+".events.jsonl"))
	if err != nil && a == nil {
		return schemas.OutputReply{}, schemas.Errf(schemas.CodeNotFound, "no such agent: %s", req.AgentID)
	}
	out := schemas.OutputReply{AgentID: req.AgentID, Which: which, Status: schemas.StatusDead}
	current, working, partial := 0, false, ""
	if a != nil && !a.isDead() {
		rec := a.record()
		out.Status, current = rec.Status, rec.Turn
		u := rec.Usage
		out.Usage = &u
		a.mu.Lock()
		working = a.turnOpen
		current = max(current, a.openTurn)
		partial = a.partial.String()
		a.mu.Unlock()
	}
	maxTurn := current
	for _, r := range recs {
		maxTurn = max(maxTurn, r.Turn)
	}
	target := maxTurn
	if req.Turn != nil {
		target = *req.Turn
	}
	live := working && target >= current
	out.Turn, out.Done = target, !live

	var text string
	switch {
	case which == schemas.WhichAll:
		var parts []string
		for t := 1; t <= maxTurn; t++ {
			body := strings.Join(turnLines(recs, t, req.IncludeTools), "\n\n")
			if working && t == current {
				body = partial
			}
			if strings.TrimSpace(body) != "" {
				parts = append(parts, fmt.Sprintf("— turn %d —\n\n%s", t, body))
			}
		}
		text = strings.Join(parts, "\n\n")
	case live && target == current:
		text = partial
	case which == schemas.WhichFullTurn:
		text = strings.Join(turnLines(recs, target, req.IncludeTools), "\n\n")
	default:
		for _, r := range recs {
			if r.Turn == target && r.Kind == schemas.KindAssistantText {
				text = r.text()
			}
		}
	}
	if n := utf8.RuneCountInString(text); n > maxChars {
		runes := []rune(text)
		text = string(runes[:maxChars])
		out.Truncated, out.DroppedChars = true, n-maxChars
	}
	out.Text = text
	return out, nil
}

// turnLines are a turn's assistant texts, with a line per tool call and
// per tool result when tools are included.
func turnLines(recs []logEntry, turn int, tools bool) []string {
	var lines []string
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Turn != turn {
			continue
		}
		switch r.Kind {
		case schemas.KindAssistantText:
			lines = append(lines, r.text())
		case schemas.KindToolUse:
			var d struct {
				Call struct {
					ToolCallID string `json:"toolCallId"`
					Title      string `json:"title"`
					Kind       string `json:"kind"`
				} `json:"call"`
			}
			if tools && json.Unmarshal(r.Data, &d) == nil && !seen[d.Call.ToolCallID] {
				seen[d.Call.ToolCallID] = true
				lines = append(lines, fmt.Sprintf("→ tool: %s (%s)", d.Call.Title, d.Call.Kind))
			}
		case schemas.KindToolResult:
			var d struct {
				Update struct {
					Status string `json:"status"`
				} `json:"update"`
			}
			if tools && json.Unmarshal(r.Data, &d) == nil && d.Update.Status != "" {
				lines = append(lines, "← result: "+d.Update.Status)
			}
		}
	}
	return lines
}

// logEntry is a line of the event log.
type logEntry struct {
	Kind schemas.Kind    `json:"kind"`
	Turn int             `json:"turn"`
	Data json.RawMessage `json:"data"`
}

func (e logEntry) text() string {
	var d struct {
		Content struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	json.Unmarshal(e.Data, &d)
	return d.Content.Text
}

func readLog(path string) ([]logEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []logEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 128<<20)
	for sc.Scan() {
		var e logEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return out, err
	}
	return out, nil
}
