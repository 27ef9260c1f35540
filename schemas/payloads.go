package schemas

import (
	"encoding/json"
	"fmt"
)

// AssistantText is assistant message content. Delta marks a streamed chunk
// to append; Delta false is the complete, authoritative block.
type AssistantText struct {
	Delta   bool         `json:"delta"`
	Content ContentBlock `json:"content"`
}

// Kind implements Payload.
func (AssistantText) Kind() Kind { return KindAssistantText }

func (p *AssistantText) decode(f *fields) {
	p.Delta = f.bool("delta", false)
	f.object("content", p.Content.decode)
}

// Thought is reasoning, with the same delta semantics as AssistantText.
type Thought struct {
	Delta   bool         `json:"delta"`
	Content ContentBlock `json:"content"`
}

// Kind implements Payload.
func (Thought) Kind() Kind { return KindThought }

func (p *Thought) decode(f *fields) {
	p.Delta = f.bool("delta", false)
	f.object("content", p.Content.decode)
}

// UserText echoes the user's own input.
type UserText struct {
	Content ContentBlock `json:"content"`
}

// Kind implements Payload.
func (UserText) Kind() Kind { return KindUserText }

func (p *UserText) decode(f *fields) { f.object("content", p.Content.decode) }

// ToolUse announces a tool invocation. A streamed call appears twice with
// one ToolCallID: an announce without input, then the authoritative copy.
type ToolUse struct {
	Call ToolCall `json:"call"`
}

// Kind implements Payload.
func (ToolUse) Kind() Kind { return KindToolUse }

func (p *ToolUse) decode(f *fields) { f.object("call", p.Call.decode) }

// ToolResult is a status or result change for a tool call.
type ToolResult struct {
	Update ToolCallUpdate `json:"update"`
}

// Kind implements Payload.
func (ToolResult) Kind() Kind { return KindToolResult }

func (p *ToolResult) decode(f *fields) { f.object("update", p.Update.decode) }

// ToolInputDelta is a streamed fragment of a tool call's input JSON; the
// fragments of one call concatenate to its input.
type ToolInputDelta struct {
	ToolCallID  string `json:"toolCallId"`
	PartialJSON string `json:"partialJson"`
}

// Kind implements Payload.
func (ToolInputDelta) Kind() Kind { return KindToolInputDelta }

func (p *ToolInputDelta) decode(f *fields) {
	p.ToolCallID = f.str("toolCallId")
	p.PartialJSON = f.str("partialJson")
}

// PlanEntry is one step of an agent's plan.
type PlanEntry struct {
	Content  string       `json:"content"`
	Priority PlanPriority `json:"priority"`
	Status   PlanStatus   `json:"status"`
}

// Plan is the agent's execution plan.
type Plan struct {
	Entries []PlanEntry `json:"entries"`
}

// Kind implements Payload.
func (Plan) Kind() Kind { return KindPlan }

// MarshalJSON writes entries as an array, never null, with enums coerced.
func (p Plan) MarshalJSON() ([]byte, error) {
	entries := make([]PlanEntry, len(p.Entries))
	for i, e := range p.Entries {
		entries[i] = PlanEntry{e.Content, ParsePlanPriority(string(e.Priority)), ParsePlanStatus(string(e.Status))}
	}
	return json.Marshal(struct {
		Entries []PlanEntry `json:"entries"`
	}{entries})
}

func (p *Plan) decode(f *fields) {
	p.Entries = []PlanEntry{}
	f.array("entries", true, func(_ int, g *fields) {
		p.Entries = append(p.Entries, PlanEntry{
			Content:  g.str("content"),
			Priority: ParsePlanPriority(g.optStr("priority")),
			Status:   ParsePlanStatus(g.optStr("status")),
		})
	})
}

// UsageUpdate is a running token and cost update (kind "usage").
type UsageUpdate struct {
	Usage Usage `json:"usage"`
}

// Kind implements Payload.
func (UsageUpdate) Kind() Kind { return KindUsage }

func (p *UsageUpdate) decode(f *fields) { f.object("usage", p.Usage.decodeTurn) }

// TurnStarted marks the start of a turn; its data is {}.
type TurnStarted struct{}

// Kind implements Payload.
func (TurnStarted) Kind() Kind { return KindTurnStarted }

func (p *TurnStarted) decode(*fields) {}

// Result ends a turn with its stop reason and the turn's usage (null when
// the backend reported none).
type Result struct {
	StopReason StopReason `json:"stopReason"`
	Usage      *Usage     `json:"usage"`
}

// Kind implements Payload.
func (Result) Kind() Kind { return KindResult }

// MarshalJSON writes the stop reason coerced to its enum.
func (p Result) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		StopReason StopReason `json:"stopReason"`
		Usage      *Usage     `json:"usage"`
	}{ParseStopReason(string(p.StopReason)), p.Usage})
}

func (p *Result) decode(f *fields) {
	p.StopReason = ParseStopReason(f.str("stopReason"))
	if f.present("usage") && !f.isNull("usage") {
		p.Usage = &Usage{}
		f.object("usage", p.Usage.decodeTurn)
	}
}

// Error reports a backend or process problem. Data carries any detail
// (the raw line that failed to parse, a subtype), or null.
type Error struct {
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// Kind implements Payload.
func (Error) Kind() Kind { return KindError }

// MarshalJSON writes data as null when unset.
func (p Error) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}{p.Message, rawOrNull(p.Data)})
}

func (p *Error) decode(f *fields) {
	p.Message = f.str("message")
	if p.Message == "" && *f.err == nil {
		f.fail("message", "is empty")
	}
	p.Data = nilIfNull(f.raw("data", false))
}

// Errorf returns an Error payload with a formatted message and no data.
func Errorf(format string, args ...any) Error {
	return Error{Message: fmt.Sprintf(format, args...)}
}

// ErrorWith returns an Error payload whose data is v encoded as JSON.
func ErrorWith(message string, v any) Error {
	data, err := json.Marshal(v)
	if err != nil {
		data = nil
	}
	return Error{Message: message, Data: data}
}

// Status is a lifecycle transition.
type Status struct {
	Status AgentStatus `json:"status"`
	// Sandbox, on the first status of a sandboxed agent's life, says what
	// it is confined to (a Shoal addition; absent otherwise).
	Sandbox *SandboxPolicy `json:"sandbox,omitempty"`
}

// Kind implements Payload.
func (Status) Kind() Kind { return KindStatus }

func (p *Status) decode(f *fields) {
	p.Status = AgentStatus(f.str("status"))
	if !p.Status.Published() {
		f.fail("status", fmt.Sprintf("status %q is not one a status event carries (want idle, working, dead or closed)", p.Status))
	}
	if raw := f.raw("sandbox", false); raw != nil && string(raw) != "null" {
		var sb SandboxPolicy
		if err := json.Unmarshal(raw, &sb); err != nil {
			f.fail("sandbox", "not a sandbox policy: "+err.Error())
			return
		}
		p.Sandbox = &sb
	}
}

// PermissionOption is one answer a permission request offers.
type PermissionOption struct {
	OptionID string         `json:"optionId"`
	Name     string         `json:"name"`
	Kind     PermissionKind `json:"kind"`
}

// PermissionToolCall identifies the call a permission request is about.
type PermissionToolCall struct {
	ToolCallID string `json:"toolCallId"`
}

// Permission records that the agent asked to approve a tool call. The
// decision follows the agent's preset and is reported separately. For an
// agent that asks people (ask), Shoal adds the tool and its input, and a
// second permission event with the same request id carries the Answer.
type Permission struct {
	ToolCall  PermissionToolCall `json:"toolCall"`
	Options   []PermissionOption `json:"options"`
	RequestID string             `json:"requestId"`
	// Shoal's additions.
	Tool   string          `json:"tool,omitempty"`
	Input  json.RawMessage `json:"input,omitempty"`
	Answer *PermitAnswer   `json:"answer,omitempty"`
}

// Kind implements Payload.
func (Permission) Kind() Kind { return KindPermission }

// MarshalJSON writes options as an array, never null, with kinds coerced.
func (p Permission) MarshalJSON() ([]byte, error) {
	opts := make([]PermissionOption, len(p.Options))
	for i, o := range p.Options {
		opts[i] = PermissionOption{o.OptionID, o.Name, ParsePermissionKind(string(o.Kind))}
	}
	return json.Marshal(struct {
		ToolCall  PermissionToolCall `json:"toolCall"`
		Options   []PermissionOption `json:"options"`
		RequestID string             `json:"requestId"`
		Tool      string             `json:"tool,omitempty"`
		Input     json.RawMessage    `json:"input,omitempty"`
		Answer    *PermitAnswer      `json:"answer,omitempty"`
	}{p.ToolCall, opts, p.RequestID, p.Tool, p.Input, p.Answer})
}

func (p *Permission) decode(f *fields) {
	f.object("toolCall", func(g *fields) { p.ToolCall.ToolCallID = g.str("toolCallId") })
	p.Options = []PermissionOption{}
	f.array("options", true, func(_ int, g *fields) {
		p.Options = append(p.Options, PermissionOption{
			OptionID: g.str("optionId"),
			Name:     g.str("name"),
			Kind:     ParsePermissionKind(g.optStr("kind")),
		})
	})
	p.RequestID = f.str("requestId")
	p.Tool = f.optStr("tool")
	p.Input = f.raw("input", false)
	if a := f.raw("answer", false); len(a) > 0 && string(a) != "null" {
		var ans PermitAnswer
		if err := json.Unmarshal(a, &ans); err != nil {
			f.fail("answer", "is not a permission answer")
		} else {
			p.Answer = &ans
		}
	}
}
