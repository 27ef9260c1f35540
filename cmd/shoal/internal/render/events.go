package render

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// userText echoes the user's input: its first lines, truncated.
func (p *Printer) userText(a *agent, c schemas.ContentBlock) {
	if !isText(c) {
		p.line(a, seg{text: "» ", style: styleUser}, seg{text: blockSummary(c), flex: true})
		return
	}
	lines := textLines(c.Text)
	if len(lines) == 0 {
		return
	}
	const shown = 3
	for i, l := range lines {
		if i == shown {
			p.line(a, seg{text: "  " + moreLines(len(lines)-shown), style: styleDim})
			break
		}
		lead := "  "
		if i == 0 {
			lead = "» "
		}
		p.line(a, seg{text: lead, style: styleUser}, seg{text: l, style: styleAccent, flex: true})
	}
}

func (p *Printer) plan(a *agent, pl schemas.Plan) {
	if len(pl.Entries) == 0 {
		p.line(a, seg{text: "plan: no steps", style: styleBold})
		return
	}
	p.line(a, seg{text: "plan: " + Plural(len(pl.Entries), "step"), style: styleBold})
	for _, e := range pl.Entries {
		mark, style := "○ ", ""
		switch schemas.ParsePlanStatus(string(e.Status)) {
		case schemas.PlanCompleted:
			mark, style = "✓ ", styleDim
		case schemas.PlanInProgress:
			mark, style = "▸ ", styleBold
		}
		p.line(a, seg{text: "  " + mark, style: style}, seg{text: oneLine(e.Content), style: style, flex: true})
	}
}

func (p *Printer) turnStarted(a *agent, turn int) {
	p.flushCalls(a)
	a.text.reset()
	a.thought.reset()
	a.calls, a.order = nil, nil
	p.line(a, seg{text: fmt.Sprintf("── turn %d ──", turn), style: styleDim})
}

func (p *Printer) result(a *agent, turn int, r schemas.Result) {
	p.flushCalls(a)
	a.text.reset()
	a.thought.reset()
	var parts []string
	style := styleDim
	switch r.StopReason {
	case "", schemas.StopEndTurn:
		if r.StopReason != "" {
			parts = append(parts, string(r.StopReason))
		}
	case schemas.StopRefusal:
		parts, style = append(parts, "⚠ "+string(r.StopReason)), styleFail
	default: // cancelled, max_tokens, max_turn_requests, unknown
		parts, style = append(parts, "⚠ "+cleanLine(string(r.StopReason))), styleWarn
	}
	if r.Usage != nil {
		parts = append(parts, usageParts(*r.Usage)...)
	}
	head := fmt.Sprintf("── turn %d ended", turn)
	body := ""
	switch {
	case len(parts) == 0:
	case r.StopReason == "":
		body = " · " + strings.Join(parts, " · ")
	default:
		head += ":"
		body = " " + strings.Join(parts, " · ")
	}
	p.line(a, seg{text: head, style: style}, seg{text: body, style: style, flex: true}, seg{text: " ──", style: style})
}

// usageParts describes token and cost usage, leaving out what is zero.
func usageParts(u schemas.Usage) []string {
	var parts []string
	if u.InputTokens != 0 || u.OutputTokens != 0 {
		parts = append(parts, groupDigits(u.InputTokens)+" in / "+groupDigits(u.OutputTokens)+" out")
	}
	var cache []string
	if u.CacheReadTokens != 0 {
		cache = append(cache, groupDigits(u.CacheReadTokens)+" read")
	}
	if u.CacheCreationTokens != 0 {
		cache = append(cache, groupDigits(u.CacheCreationTokens)+" written")
	}
	if len(cache) > 0 {
		parts = append(parts, "cache "+strings.Join(cache, ", "))
	}
	if u.CostUSD != nil && *u.CostUSD != 0 {
		parts = append(parts, formatCost(*u.CostUSD))
	}
	return parts
}

func (p *Printer) error(a *agent, e schemas.Error) {
	lines := textLines(e.Message)
	if len(lines) == 0 {
		detail := ""
		if d := compactJSON(e.Data); d != "" && d != "null" {
			detail = " " + d
		}
		p.line(a, seg{text: "✗ error", style: styleFail}, seg{text: detail, style: styleError, flex: true})
		return
	}
	// Errors are not truncated, but a stack trace is capped.
	const shown = 20
	for i, l := range lines {
		switch {
		case i == shown:
			p.line(a, seg{text: "  " + moreLines(len(lines)-shown), style: styleError})
			return
		case i == 0:
			p.line(a, seg{text: "✗ error: ", style: styleFail}, seg{text: l, style: styleError})
		default:
			p.line(a, seg{text: "  " + l, style: styleError})
		}
	}
}

func (p *Printer) status(a *agent, s schemas.AgentStatus) {
	switch s {
	case schemas.StatusIdle, schemas.StatusWorking:
		return // implied by turn separators
	case schemas.StatusStarting:
		p.line(a, seg{text: "■ agent starting", style: styleDim})
	case schemas.StatusDead, schemas.StatusClosed:
		p.flushCalls(a)
		style := styleDim
		if s == schemas.StatusDead {
			style = styleFail
		}
		p.line(a, seg{text: "■ agent " + string(s), style: style})
		// The agent is gone; forget its state.
		delete(p.agents, a.id)
	case "":
		p.line(a, seg{text: "■ agent status unknown", style: styleDim})
	default:
		p.line(a, seg{text: "■ agent " + cleanLine(string(s)), style: styleDim, flex: true})
	}
}

func (p *Printer) permission(a *agent, pm schemas.Permission) {
	if ans := pm.Answer; ans != nil {
		// The answer to a request shown before.
		text := fmt.Sprintf("? permission %s%s by %s", requestWord(pm), map[schemas.Decision]string{schemas.DecisionAllow: "allowed", schemas.DecisionDeny: "denied"}[ans.Decision], cleanLine(ans.By))
		if pm.Tool != "" {
			text += " for " + cleanLine(pm.Tool)
		}
		if ans.Message != "" {
			text += ": " + cleanLine(ans.Message)
		}
		p.line(a, seg{text: text, style: styleWarn, flex: true})
		return
	}
	id := pm.ToolCall.ToolCallID
	// Named by the request's id, the one shoal permit takes.
	text := "? permission " + requestWord(pm) + "requested"
	if id != "" {
		text += " for " + cleanLine(id)
		if c := a.calls[id]; c != nil {
			p.flushCall(a, c)
			if l := c.label(); l != "" {
				text += ": " + l
			}
		}
	}
	var names []string
	for _, o := range pm.Options {
		n := o.Name
		if n == "" {
			n = o.OptionID
		}
		if n == "" {
			n = string(o.Kind)
		}
		names = append(names, cleanLine(n))
	}
	opts := " (no options)"
	if len(names) > 0 {
		opts = " (options: " + strings.Join(names, ", ") + ")"
	}
	p.line(a, seg{text: text, style: styleWarn, flex: true}, seg{text: opts, style: styleWarn, flex: true})
}

// fallback renders a payload render does not know as "· kind {json}".
func (p *Printer) fallback(a *agent, pl schemas.Payload) {
	kind := safeKind(pl)
	detail := ""
	if pl != nil {
		if b, err := json.Marshal(pl); err == nil {
			detail = " " + cleanLine(string(b))
		} else {
			detail = " " + cleanLine(fmt.Sprintf("%+v", pl))
		}
	}
	p.line(a, seg{text: "· " + kind, style: styleDim}, seg{text: detail, style: styleDim, flex: true})
}

// requestWord is a permission request's id and a space, as shoal permit
// takes it, or nothing when the event carries none.
func requestWord(pm schemas.Permission) string {
	if pm.RequestID == "" {
		return ""
	}
	return cleanLine(pm.RequestID) + " "
}
