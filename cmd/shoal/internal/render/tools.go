package render

import (
	"encoding/json"

	"github.com/shoalfabric/shoal/schemas"
)

// maxCalls bounds the calls remembered per agent when turns never end.
const maxCalls = 4096

// call is what is known of one tool call, merged from its tool_use copies
// and tool_result updates.
type call struct {
	id        string
	title     string
	kind      schemas.ToolKind
	input     json.RawMessage
	locations []schemas.Location
	content   []schemas.ToolCallContent // proposed by tool_use (an edit's diff)
	produced  []schemas.ToolCallContent // reported by tool_result
	output    json.RawMessage
	uses      int                // tool_use copies seen
	printed   bool               // its ▶ line is out
	result    schemas.ToolStatus // the terminal status whose ↳ line is out
}

// call returns the agent's call id, remembering it if new.
func (a *agent) call(id string) *call {
	if c := a.calls[id]; c != nil {
		return c
	}
	if a.calls == nil || len(a.calls) >= maxCalls {
		a.calls, a.order = map[string]*call{}, nil
	}
	c := &call{id: id}
	a.calls[id] = c
	a.order = append(a.order, id)
	return c
}

// toolUse prints a call's ▶ line once, as soon as its input is known: a
// streamed call is announced without input and repeated with it, so an
// input-less first copy waits for the second (or for the call's result,
// a permission request or the end of the turn, whichever comes first).
func (p *Printer) toolUse(a *agent, tc schemas.ToolCall) {
	if tc.ToolCallID == "" {
		// Nothing to match a later copy with: print what there is.
		c := &call{}
		c.mergeUse(tc)
		p.printCall(a, c)
		return
	}
	c := a.call(tc.ToolCallID)
	c.uses++
	c.mergeUse(tc)
	if !c.printed && (c.uses > 1 || hasInput(tc.RawInput) || len(tc.Locations) > 0 || len(tc.Content) > 0) {
		p.printCall(a, c)
	}
}

func (c *call) mergeUse(tc schemas.ToolCall) {
	if tc.Title != "" {
		c.title = tc.Title
	}
	if tc.Kind != "" {
		c.kind = tc.Kind
	}
	if hasInput(tc.RawInput) || c.input == nil {
		c.input = tc.RawInput
	}
	if len(tc.Locations) > 0 {
		c.locations = tc.Locations
	}
	if len(tc.Content) > 0 {
		c.content = tc.Content
	}
	if len(tc.RawOutput) > 0 && string(tc.RawOutput) != "null" {
		c.output = tc.RawOutput
	}
}

func (c *call) mergeUpdate(u schemas.ToolCallUpdate) {
	if u.Title != nil && *u.Title != "" {
		c.title = *u.Title
	}
	if u.Kind != nil {
		c.kind = *u.Kind
	}
	if hasInput(u.RawInput) {
		c.input = u.RawInput
	}
	if len(u.Locations) > 0 {
		c.locations = u.Locations
	}
	if len(u.Content) > 0 {
		c.produced = u.Content
	}
	if len(u.RawOutput) > 0 && string(u.RawOutput) != "null" {
		c.output = u.RawOutput
	}
}

// toolResult prints a ↳ line when a call completes or fails. Progress
// updates print nothing but are remembered, so a final update without
// content still shows the last output.
func (p *Printer) toolResult(a *agent, u schemas.ToolCallUpdate) {
	var status schemas.ToolStatus
	if u.Status != nil {
		status = *u.Status
	}
	terminal := status == schemas.ToolCompleted || status == schemas.ToolFailed
	if u.ToolCallID == "" && !terminal && len(u.Content) == 0 {
		p.line(a, seg{text: "↳ (empty tool result)", style: styleDim})
		return
	}
	c := &call{}
	if u.ToolCallID != "" {
		c = a.call(u.ToolCallID)
	}
	c.mergeUpdate(u)
	if c.uses > 0 && !c.printed && (terminal || hasInput(u.RawInput)) {
		p.printCall(a, c)
	}
	if !terminal || c.result == status {
		return
	}
	c.result = status
	label := ""
	if a.lastTool != c.id || c.id == "" {
		// Other lines came between the call and its result: say which.
		if l := c.label(); l != "" {
			label = "[" + truncate(l, 40) + "] "
		}
	}
	head, style := "↳ completed  ", styleOK
	if status == schemas.ToolFailed {
		head, style = "↳ failed  ", styleFail
	}
	produced := c.produced
	if len(produced) == 0 {
		produced = c.content
	}
	lines := resultLines(produced, c.output)
	body, more := "", ""
	if len(lines) > 0 {
		body = lines[0]
		if len(lines) > 1 {
			more = "  " + moreLines(len(lines)-1)
		}
	}
	p.line(a,
		seg{text: head, style: style},
		seg{text: label, style: styleDim, flex: true},
		seg{text: body, flex: true},
		seg{text: more, style: styleDim})
}

// flushCalls prints the ▶ line of every call still waiting for its input.
func (p *Printer) flushCalls(a *agent) {
	for _, id := range a.order {
		if c := a.calls[id]; c != nil {
			p.flushCall(a, c)
		}
	}
}

func (p *Printer) flushCall(a *agent, c *call) {
	if c.uses > 0 && !c.printed {
		p.printCall(a, c)
	}
}

// printCall writes "▶ Title  summary".
func (p *Printer) printCall(a *agent, c *call) {
	c.printed = true
	title, summary := c.titleAndSummary()
	if summary != "" {
		summary = "  " + summary
	}
	p.line(a, seg{text: "▶ " + title, style: styleTool, flex: true}, seg{text: summary, flex: true})
	a.lastTool = c.id
}

func (c *call) titleAndSummary() (title, summary string) {
	title = cleanLine(c.title)
	if title == "" {
		title = string(c.kind)
		if title == "" || c.kind == schemas.ToolOther {
			title = "tool"
		}
	}
	summary = c.summary()
	if summary != "" && containsFold(title, summary) {
		summary = "" // the title already says it (ACP titles often do)
	}
	return title, summary
}

// label names a call in one short phrase, for lines that refer back to it.
func (c *call) label() string {
	if c.title == "" && c.kind == "" && !hasInput(c.input) && len(c.locations) == 0 {
		return ""
	}
	title, summary := c.titleAndSummary()
	if summary == "" {
		return title
	}
	return title + " " + summary
}

// summary is the most telling part of a call's input, on one line.
func (c *call) summary() string {
	if s := inputSummary(c.input); s != "" {
		return s
	}
	if len(c.locations) > 0 {
		return locationSummary(c.locations[0])
	}
	for _, tc := range c.content {
		if s := contentSummary(tc); s != "" {
			return s
		}
	}
	return ""
}
