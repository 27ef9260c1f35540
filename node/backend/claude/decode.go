package claude

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// Decoder maps the CLI's stream-json stdout onto event payloads, one line
// at a time. It keeps the state the mapping needs: the vendor session id
// and which content block index belongs to which streamed tool call. It is
// not safe for concurrent use.
type Decoder struct {
	sessionID string
	toolIDs   map[int]string // content block index → tool call id, within one message
	// suggestions are the permission rules the CLI offered with each
	// permission request, by its request id, until the session takes them.
	suggestions map[string]json.RawMessage
	// turnUse is what each model message of the running turn used, by
	// message id, as its latest line says (each line of a message repeats
	// its usage, the output count growing); changed says it changed since
	// TurnUsage last read it.
	turnUse map[string]usage
	changed bool
	// begun counts the turns the CLI began: it prints system/init as it
	// takes up each user line, a slash command's too.
	begun int
}

// Begun is how many turns the CLI has begun (system/init lines).
func (d *Decoder) Begun() int { return d.begun }

// TurnUsage is what the running turn's model messages have used so far,
// and whether that changed since it was last read. The turn's result
// says it in all.
func (d *Decoder) TurnUsage() (schemas.Usage, bool) {
	if !d.changed {
		return schemas.Usage{}, false
	}
	d.changed = false
	sum := d.turnSum()
	return sum.toSchema(), true
}

// turnSum is what the running turn's model messages used, as they said.
func (d *Decoder) turnSum() usage {
	var sum usage
	for _, u := range d.turnUse {
		sum.InputTokens += u.InputTokens
		sum.OutputTokens += u.OutputTokens
		sum.CacheReadInputTokens += u.CacheReadInputTokens
		sum.CacheCreationInputTokens += u.CacheCreationInputTokens
	}
	return sum
}

// Suggestions takes the permission rules the CLI offered with a request.
func (d *Decoder) Suggestions(requestID string) json.RawMessage {
	s := d.suggestions[requestID]
	delete(d.suggestions, requestID)
	return s
}

// SessionID is the CLI's conversation id, once a system line carried it.
func (d *Decoder) SessionID() string { return d.sessionID }

// line is every field of a stream-json line the mapping reads, so each
// line is parsed once whatever its type.
type line struct {
	Type      string  `json:"type"`
	Subtype   string  `json:"subtype"`
	SessionID *string `json:"session_id"`
	Event     struct {
		Type         string `json:"type"`
		Index        int    `json:"index"`
		ContentBlock struct {
			Type string `json:"type"`
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"content_block"`
		Delta struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Thinking    string `json:"thinking"`
			PartialJSON string `json:"partial_json"`
		} `json:"delta"`
	} `json:"event"`
	Message struct {
		ID      string   `json:"id"`
		Content contents `json:"content"`
		Usage   *usage   `json:"usage"`
	} `json:"message"`
	IsError    bool    `json:"is_error"`
	Result     *string `json:"result"`
	StopReason *string `json:"stop_reason"`
	Usage      *usage  `json:"usage"`
	RequestID  string  `json:"request_id"`
	Request    struct {
		Subtype     string          `json:"subtype"`
		ToolName    string          `json:"tool_name"`
		ToolUseID   string          `json:"tool_use_id"`
		Input       json.RawMessage `json:"input"`
		Description string          `json:"description"`
		Suggestions json.RawMessage `json:"permission_suggestions"`
	} `json:"request"`
	Response struct {
		Subtype   string `json:"subtype"`
		RequestID string `json:"request_id"`
		Error     string `json:"error"`
	} `json:"response"`
}

// block is a content block of an assistant or user message.
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   *bool           `json:"is_error"`
}

// contents is a message's content: an array of blocks, or a plain string
// (the CLI echoing input), which holds no blocks.
type contents []block

func (c *contents) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		*c = nil
		return nil
	}
	return json.Unmarshal(b, (*[]block)(c))
}

// Line decodes one line of stdout into the payloads it yields, in order.
// interrupted says whether an interrupt was requested for the running
// turn, which changes how its result reads. A line Shoal does not
// understand yields an error payload carrying the raw line.
func (d *Decoder) Line(raw []byte, interrupted bool) []schemas.Payload {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	if p, ok := d.fastDelta(raw); ok {
		return []schemas.Payload{p}
	}
	return d.decodeLine(raw, interrupted)
}

// decodeLine is Line for any line, through encoding/json.
func (d *Decoder) decodeLine(raw []byte, interrupted bool) []schemas.Payload {
	var l line
	if err := json.Unmarshal(raw, &l); err != nil || l.Type == "" {
		return []schemas.Payload{rawError("stream-json parse error", raw)}
	}
	switch l.Type {
	case "system":
		if l.SessionID != nil && *l.SessionID != "" {
			d.sessionID = *l.SessionID
		}
		if l.Subtype == "init" {
			d.begun++
		}
		return nil
	case "stream_event":
		return d.streamEvent(&l)
	case "assistant":
		return d.assistant(&l, raw)
	case "user":
		return d.user(&l)
	case "result":
		return d.result(&l, interrupted)
	case "control_response":
		return controlResponse(&l)
	case "control_request":
		return d.controlRequest(&l, raw)
	case "keep_alive", "rate_limit_event":
		return nil
	}
	return []schemas.Payload{rawError("unmapped claude stream-json event: "+l.Type, raw)}
}

func (d *Decoder) streamEvent(l *line) []schemas.Payload {
	ev := &l.Event
	switch ev.Type {
	case "message_start":
		d.toolIDs = nil
	case "content_block_start":
		if ev.ContentBlock.Type == "tool_use" {
			if d.toolIDs == nil {
				d.toolIDs = map[int]string{}
			}
			d.toolIDs[ev.Index] = ev.ContentBlock.ID
			return []schemas.Payload{schemas.ToolUse{Call: toolCall(ev.ContentBlock.ID, ev.ContentBlock.Name, nil)}}
		}
	case "content_block_delta":
		switch ev.Delta.Type {
		case "text_delta":
			return []schemas.Payload{schemas.AssistantText{Delta: true, Content: schemas.Text(ev.Delta.Text)}}
		case "thinking_delta":
			return []schemas.Payload{schemas.Thought{Delta: true, Content: schemas.Text(ev.Delta.Thinking)}}
		case "input_json_delta":
			return []schemas.Payload{schemas.ToolInputDelta{ToolCallID: d.toolIDs[ev.Index], PartialJSON: ev.Delta.PartialJSON}}
		}
	}
	return nil
}

func (d *Decoder) assistant(l *line, raw []byte) []schemas.Payload {
	if m := &l.Message; m.ID != "" && m.Usage != nil {
		if d.turnUse == nil {
			d.turnUse = map[string]usage{}
		}
		if d.turnUse[m.ID] != *m.Usage {
			d.turnUse[m.ID], d.changed = *m.Usage, true
		}
	}
	var out []schemas.Payload
	for _, c := range l.Message.Content {
		switch c.Type {
		case "text":
			out = append(out, schemas.AssistantText{Content: schemas.Text(c.Text)})
		case "thinking":
			out = append(out, schemas.Thought{Content: schemas.Text(c.Thinking)})
		case "redacted_thinking":
			out = append(out, schemas.Thought{Content: schemas.Text("")})
		case "tool_use", "server_tool_use":
			out = append(out, schemas.ToolUse{Call: toolCall(c.ID, c.Name, c.Input)})
		default:
			out = append(out, rawError("unmapped claude content block: "+c.Type, raw))
		}
	}
	return out
}

func toolCall(id, name string, input json.RawMessage) schemas.ToolCall {
	title := name
	if title == "" {
		title = "tool"
	}
	return schemas.ToolCall{
		ToolCallID: id,
		Title:      title,
		Kind:       schemas.ToolKindForName(name),
		Status:     schemas.ToolInProgress,
		RawInput:   input,
	}
}

func (d *Decoder) user(l *line) []schemas.Payload {
	var out []schemas.Payload
	for _, b := range l.Message.Content {
		if b.Type != "tool_result" {
			continue // the interrupt marker and other echoed text
		}
		status := schemas.ToolCompleted
		if b.IsError != nil && *b.IsError {
			status = schemas.ToolFailed
		}
		out = append(out, schemas.ToolResult{Update: schemas.ToolCallUpdate{
			ToolCallID: b.ToolUseID,
			Status:     &status,
			Content:    toolResultContent(b.Content),
		}})
	}
	return out
}

// toolResultContent converts a tool_result's content: a string becomes one
// text block; an array keeps its text and image blocks.
func toolResultContent(raw json.RawMessage) []schemas.ToolCallContent {
	out := []schemas.ToolCallContent{}
	if len(raw) == 0 || string(raw) == "null" {
		return out
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return append(out, schemas.ToolText(s))
	}
	var blocks []struct {
		Type   string `json:"type"`
		Text   string `json:"text"`
		Source struct {
			Data      string `json:"data"`
			MediaType string `json:"media_type"`
		} `json:"source"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return append(out, schemas.ToolText(string(raw)))
	}
	for _, b := range blocks {
		switch b.Type {
		case "text":
			out = append(out, schemas.ToolText(b.Text))
		case "image":
			mime := b.Source.MediaType
			if mime == "" {
				mime = "image/png"
			}
			out = append(out, schemas.ToolBlock(schemas.Image(b.Source.Data, mime)))
		}
	}
	return out
}

func (d *Decoder) result(m *line, interrupted bool) []schemas.Payload {
	d.toolIDs = nil
	var out []schemas.Payload
	text := ""
	if m.Result != nil {
		text = *m.Result
	}
	if m.IsError && !interrupted {
		msg := text
		if strings.TrimSpace(msg) == "" {
			msg = m.Subtype
		}
		if strings.TrimSpace(msg) == "" {
			msg = "agent turn failed"
		}
		out = append(out, schemas.ErrorWith(msg, map[string]any{"subtype": m.Subtype, "is_error": true, "result": m.Result}))
	}
	stop := schemas.StopEndTurn
	switch {
	case interrupted:
		stop = schemas.StopCancelled
	case m.StopReason != nil && *m.StopReason != "":
		stop = schemas.ParseStopReason(*m.StopReason)
	case m.IsError:
		stop = schemas.StopRefusal
	}
	// The CLI says a turn it was interrupted in used nothing, though its
	// model messages said what they used: the result carries the larger
	// of the two, field by field, so a cut turn's spend is not lost.
	seen := d.turnSum()
	d.turnUse, d.changed = nil, false
	var said usage
	if m.Usage != nil {
		said = *m.Usage
	}
	u := usage{InputTokens: max(said.InputTokens, seen.InputTokens), OutputTokens: max(said.OutputTokens, seen.OutputTokens),
		CacheReadInputTokens: max(said.CacheReadInputTokens, seen.CacheReadInputTokens), CacheCreationInputTokens: max(said.CacheCreationInputTokens, seen.CacheCreationInputTokens)}
	su := u.toSchema()
	return append(out, schemas.Result{StopReason: stop, Usage: &su})
}

// usage is the CLI's per-turn usage in a result line.
type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
}

// toSchema maps usage; the CLI's dollar figure is unreliable on
// subscription plans, so cost is always 0.
func (u *usage) toSchema() schemas.Usage {
	out := schemas.Usage{CostUSD: schemas.Cost(0)}
	if u != nil {
		out.InputTokens = u.InputTokens
		out.OutputTokens = u.OutputTokens
		out.CacheReadTokens = u.CacheReadInputTokens
		out.CacheCreationTokens = u.CacheCreationInputTokens
	}
	return out
}

func controlResponse(m *line) []schemas.Payload {
	if m.Response.Subtype != "error" {
		return nil
	}
	msg := m.Response.Error
	if msg == "" {
		msg = "unknown"
	}
	return []schemas.Payload{schemas.ErrorWith(fmt.Sprintf("control request failed: %s", msg), map[string]string{"request_id": m.Response.RequestID})}
}

// controlRequest maps the CLI asking permission for a tool call (it does
// only when started with --permission-prompt-tool stdio) to a permission
// event; the session answers it.
func (d *Decoder) controlRequest(m *line, raw []byte) []schemas.Payload {
	if m.Request.Subtype != "can_use_tool" {
		return []schemas.Payload{rawError("unmapped claude stream-json event: control_request", raw)}
	}
	options := []schemas.PermissionOption{
		{OptionID: "allow", Name: "Allow", Kind: schemas.PermissionAllowOnce},
		{OptionID: "deny", Name: "Deny", Kind: schemas.PermissionRejectOnce},
	}
	if s := m.Request.Suggestions; len(s) > 0 && string(s) != "null" && string(s) != "[]" {
		if d.suggestions == nil {
			d.suggestions = map[string]json.RawMessage{}
		}
		d.suggestions[m.RequestID] = s
		options = append(options, schemas.PermissionOption{OptionID: "allow_always", Name: "Allow always, in this session", Kind: schemas.PermissionAllowAlways})
	}
	return []schemas.Payload{schemas.Permission{
		ToolCall:  schemas.PermissionToolCall{ToolCallID: m.Request.ToolUseID},
		RequestID: m.RequestID,
		Tool:      m.Request.ToolName,
		Input:     m.Request.Input,
		Options:   options,
	}}
}

// rawError is an error payload carrying a line Shoal could not map, as a
// JSON string, so nothing the CLI said is lost.
func rawError(msg string, line []byte) schemas.Payload {
	return schemas.ErrorWith(msg, string(line))
}
