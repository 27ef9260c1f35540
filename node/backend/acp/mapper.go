package acp

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// maxRememberedCalls bounds how many tool call ids keep their paths.
const maxRememberedCalls = 512

// mapper turns the `update` objects of ACP session/update notifications
// into Shoal payloads, in order. Besides the mapping it keeps what the
// rest of the session asks about later: which tool calls are still open,
// the paths each call touches, the latest cost, and the turn's streamed
// text. It is safe for concurrent use, so a permission request answered
// off the reader can ask for paths while updates arrive.
type mapper struct {
	mu        sync.Mutex
	open      []string            // tool calls started and not yet completed or failed, oldest first
	callPaths map[string][]string // tool call id → its paths, for at most maxRememberedCalls ids
	pathOrder []string            // the ids in callPaths, oldest first
	lastCost  *float64            // the session's cost so far, as its latest usage_update said
	costTaken float64             // how much of lastCost earlier turns have reported
	costCarry float64             // what a replaced session cost that no turn has reported yet
	thought   strings.Builder
	text      strings.Builder
}

func newMapper() *mapper {
	return &mapper{callPaths: map[string][]string{}}
}

// updateHead is the one field every session/update has, with the
// content of the chunks, the commonest updates, read in the same pass.
type updateHead struct {
	SessionUpdate *string         `json:"sessionUpdate"`
	Content       json.RawMessage `json:"content"`
}

// toolCallFields is tool_call and tool_call_update. A nil field was absent
// (or null); content stays raw because each entry is mapped leniently.
type toolCallFields struct {
	ToolCallID *string             `json:"toolCallId"`
	Title      *string             `json:"title"`
	Kind       *schemas.ToolKind   `json:"kind"`
	Status     *schemas.ToolStatus `json:"status"`
	Content    json.RawMessage     `json:"content"`
	Locations  []schemas.Location  `json:"locations"`
	RawInput   json.RawMessage     `json:"rawInput"`
	RawOutput  json.RawMessage     `json:"rawOutput"`
}

// planUpdate is plan; PlanEntry coerces unknown priorities and statuses.
type planUpdate struct {
	Entries []schemas.PlanEntry `json:"entries"`
}

// usageUpdate is usage_update, of which only the cost matters here.
type usageUpdate struct {
	Cost *struct {
		Amount *float64 `json:"amount"`
	} `json:"cost"`
}

// update maps one notification's params.update object. It never panics:
// an update it cannot read yields one error payload naming the problem,
// with the update as data.
func (m *mapper) update(raw json.RawMessage) []schemas.Payload {
	raw = bytes.TrimSpace(raw)
	if !utf8.Valid(raw) {
		raw = []byte(strings.ToValidUTF8(string(raw), "\uFFFD"))
	}
	if len(raw) == 0 {
		return malformed("session/update", "no update object", raw)
	}
	var head updateHead
	if err := json.Unmarshal(raw, &head); err != nil {
		return malformed("session/update", err.Error(), raw)
	}
	if head.SessionUpdate == nil {
		return malformed("session/update", "no sessionUpdate", raw)
	}
	kind := *head.SessionUpdate

	m.mu.Lock()
	defer m.mu.Unlock()
	switch kind {
	case "agent_message_chunk", "agent_thought_chunk", "user_message_chunk":
		return m.chunk(kind, head.Content, raw)
	case "tool_call":
		return m.toolCall(raw)
	case "tool_call_update":
		return m.toolCallUpdate(raw)
	case "plan":
		var u planUpdate
		if err := json.Unmarshal(raw, &u); err != nil {
			return malformed(kind, err.Error(), raw)
		}
		if u.Entries == nil {
			u.Entries = []schemas.PlanEntry{}
		}
		return []schemas.Payload{schemas.Plan{Entries: u.Entries}}
	case "usage_update":
		var u usageUpdate
		if err := json.Unmarshal(raw, &u); err != nil {
			return malformed(kind, err.Error(), raw)
		}
		if u.Cost != nil && u.Cost.Amount != nil {
			m.lastCost = u.Cost.Amount
		}
		return nil
	case "current_mode_update", "available_commands_update", "config_option_update", "session_info_update":
		// The session logs mode changes; commands, the config options a
		// model or mode switch re-announces, and session titles are not
		// events of Shoal's.
		return nil
	}
	return []schemas.Payload{schemas.ErrorWith("unmapped session/update: "+kind, json.RawMessage(raw))}
}

func (m *mapper) chunk(kind string, content, raw json.RawMessage) []schemas.Payload {
	if isAbsent(content) {
		return malformed(kind, "no content", raw)
	}
	block := contentBlock(content)
	switch kind {
	case "agent_message_chunk":
		if block.Type == schemas.ContentText {
			m.text.WriteString(block.Text)
		}
		return []schemas.Payload{schemas.AssistantText{Delta: true, Content: block}}
	case "agent_thought_chunk":
		if block.Type == schemas.ContentText {
			m.thought.WriteString(block.Text)
		}
		return []schemas.Payload{schemas.Thought{Delta: true, Content: block}}
	}
	return []schemas.Payload{schemas.UserText{Content: block}}
}

// toolCall maps tool_call to a tool_use carrying every field, opening the
// call unless it is already over.
func (m *mapper) toolCall(raw json.RawMessage) []schemas.Payload {
	f, content, bad := decodeToolCall("tool_call", raw)
	if bad != nil {
		return bad
	}
	call := schemas.ToolCall{
		ToolCallID: *f.ToolCallID,
		Kind:       schemas.ToolOther,
		Status:     schemas.ToolPending,
		Content:    content,
		Locations:  f.Locations,
		RawInput:   f.RawInput,
		RawOutput:  f.RawOutput,
	}
	if f.Title != nil {
		call.Title = *f.Title
	}
	if f.Kind != nil {
		call.Kind = *f.Kind
	}
	if f.Status != nil {
		call.Status = *f.Status
	}
	m.track(call.ToolCallID, call.Status)
	m.remember(&f)
	return []schemas.Payload{schemas.ToolUse{Call: call}}
}

// toolCallUpdate maps tool_call_update to a tool_result carrying only the
// fields the update has.
func (m *mapper) toolCallUpdate(raw json.RawMessage) []schemas.Payload {
	f, content, bad := decodeToolCall("tool_call_update", raw)
	if bad != nil {
		return bad
	}
	u := schemas.ToolCallUpdate{
		ToolCallID: *f.ToolCallID,
		Title:      f.Title,
		Kind:       f.Kind,
		Status:     f.Status,
		Content:    content,
		Locations:  f.Locations,
		RawInput:   f.RawInput,
		RawOutput:  f.RawOutput,
	}
	if f.Status != nil && isOver(*f.Status) {
		m.close(u.ToolCallID)
	}
	m.remember(&f)
	return []schemas.Payload{schemas.ToolResult{Update: u}}
}

// decodeToolCall reads a tool_call or tool_call_update, or says why not.
func decodeToolCall(kind string, raw json.RawMessage) (f toolCallFields, content []schemas.ToolCallContent, bad []schemas.Payload) {
	if err := json.Unmarshal(raw, &f); err != nil {
		return f, nil, malformed(kind, err.Error(), raw)
	}
	if f.ToolCallID == nil {
		return f, nil, malformed(kind, "no toolCallId", raw)
	}
	if !isAbsent(f.Content) {
		var entries []json.RawMessage
		if err := json.Unmarshal(f.Content, &entries); err != nil {
			return f, nil, malformed(kind, "content is not an array", raw)
		}
		content = make([]schemas.ToolCallContent, len(entries))
		for i, e := range entries {
			content[i] = toolContent(e)
		}
	}
	if isAbsent(f.RawInput) {
		f.RawInput = nil
	}
	if isAbsent(f.RawOutput) {
		f.RawOutput = nil
	}
	return f, content, nil
}

// toolContent maps one entry of a tool call's content: content, diff and
// terminal entries as they are; anything else becomes the entry's
// content, or the entry itself, as a content block.
func toolContent(raw json.RawMessage) schemas.ToolCallContent {
	var t schemas.ToolCallContent
	if json.Unmarshal(raw, &t) == nil {
		return t
	}
	var entry map[string]json.RawMessage
	if json.Unmarshal(raw, &entry) == nil && !isAbsent(entry["content"]) {
		return schemas.ToolBlock(contentBlock(entry["content"]))
	}
	return schemas.ToolBlock(contentBlock(raw))
}

// embeddedResource is ACP's resource block, which nests what Shoal's
// resource block carries flat.
type embeddedResource struct {
	Type     string `json:"type"`
	Resource *struct {
		URI      *string `json:"uri"`
		Text     string  `json:"text"`
		Blob     string  `json:"blob"`
		MimeType string  `json:"mimeType"`
	} `json:"resource"`
}

// contentBlock maps an ACP content block by its type. A block of a type
// Shoal does not know, or one it cannot read, keeps its JSON as text.
func contentBlock(raw json.RawMessage) schemas.ContentBlock {
	var c schemas.ContentBlock
	if json.Unmarshal(raw, &c) == nil {
		return c
	}
	var r embeddedResource
	if json.Unmarshal(raw, &r) == nil && r.Type == schemas.ContentResource && r.Resource != nil && r.Resource.URI != nil {
		return schemas.ContentBlock{
			Type:     schemas.ContentResource,
			URI:      *r.Resource.URI,
			Text:     r.Resource.Text,
			Blob:     r.Resource.Blob,
			MimeType: r.Resource.MimeType,
		}
	}
	var compact bytes.Buffer
	if json.Compact(&compact, raw) != nil {
		return schemas.Text(string(raw))
	}
	return schemas.Text(compact.String())
}

// track opens a call that is running and closes one that is over.
func (m *mapper) track(id string, status schemas.ToolStatus) {
	if isOver(status) {
		m.close(id)
		return
	}
	if !slices.Contains(m.open, id) {
		m.open = append(m.open, id)
	}
}

func (m *mapper) close(id string) {
	m.open = slices.DeleteFunc(m.open, func(o string) bool { return o == id })
}

func isOver(s schemas.ToolStatus) bool {
	return s == schemas.ToolCompleted || s == schemas.ToolFailed
}

// retire ends every open tool call with a synthetic failed tool_result
// whose content is the text why ("cancelled", "agent exited"), in the
// order the calls were opened, and forgets them.
func (m *mapper) retire(why string) []schemas.Payload {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []schemas.Payload
	for _, id := range m.open {
		failed := schemas.ToolFailed
		out = append(out, schemas.ToolResult{Update: schemas.ToolCallUpdate{
			ToolCallID: id,
			Status:     &failed,
			Content:    []schemas.ToolCallContent{schemas.ToolText(why)},
		}})
	}
	m.open = nil
	return out
}

// remember adds the paths of a tool call or update to those of its id:
// rawInput values under a key that contains "path" or is file, cwd, dir
// or directory (a string or a list of strings), then every location's
// path. Keys are matched case-insensitively, so opencode's filePath
// counts. Only the newest maxRememberedCalls ids are kept.
func (m *mapper) remember(f *toolCallFields) {
	var found []string
	var input map[string]json.RawMessage
	if json.Unmarshal(f.RawInput, &input) == nil {
		for _, k := range slices.Sorted(maps.Keys(input)) {
			if isPathKey(k) {
				found = append(found, stringOrStrings(input[k])...)
			}
		}
	}
	for _, l := range f.Locations {
		if l.Path != "" {
			found = append(found, l.Path)
		}
	}
	if len(found) == 0 {
		return
	}
	id := *f.ToolCallID
	known, ok := m.callPaths[id]
	if !ok {
		if len(m.pathOrder) >= maxRememberedCalls {
			delete(m.callPaths, m.pathOrder[0])
			m.pathOrder = slices.Delete(m.pathOrder, 0, 1)
		}
		m.pathOrder = append(m.pathOrder, id)
	}
	for _, p := range found {
		if !slices.Contains(known, p) {
			known = append(known, p)
		}
	}
	m.callPaths[id] = known
}

func isPathKey(k string) bool {
	k = strings.ToLower(k)
	switch k {
	case "file", "cwd", "dir", "directory":
		return true
	}
	return strings.Contains(k, "path")
}

// stringOrStrings reads a non-empty string, or the non-empty strings of a
// list; anything else holds no path.
func stringOrStrings(raw json.RawMessage) []string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil
		}
		return []string{s}
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil
	}
	var out []string
	for _, e := range list {
		if json.Unmarshal(e, &s) == nil && s != "" {
			out = append(out, s)
		}
	}
	return out
}

// paths returns the file paths remembered for a tool call, across its
// tool_call and tool_call_updates, or nil.
func (m *mapper) paths(toolCallID string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.callPaths[toolCallID])
}

// takeTurnCost returns what the session has cost since the last turn
// took its cost, or nil when no usage_update has said. A total lower
// than the last one taken is a count begun again: all of it is new.
// A turn's usage is the turn's own: the agent's record and every budget
// sum turns, so a turn reporting the session's total would count each
// earlier turn again.
func (m *mapper) takeTurnCost() *float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.turnCostLocked()
	if c != nil && m.lastCost != nil {
		m.costTaken = *m.lastCost
	}
	m.costCarry = 0
	return c
}

// turnCost is what takeTurnCost would return, without taking it: the
// running turn's cost so far.
func (m *mapper) turnCost() *float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.turnCostLocked()
}

func (m *mapper) turnCostLocked() *float64 {
	if m.lastCost == nil && m.costCarry == 0 {
		return nil
	}
	c := m.costCarry
	if last := m.lastCost; last != nil {
		if *last >= m.costTaken {
			c += *last - m.costTaken
		} else {
			c += *last // the agent began its count again
		}
	}
	return &c
}

// newSession starts the cost over for a session that replaced the one
// before (ACP's cost is per session), carrying what the old one cost
// since its last turn took its cost to the next turn.
func (m *mapper) newSession() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastCost != nil {
		m.costCarry += max(*m.lastCost-m.costTaken, 0)
	}
	m.lastCost, m.costTaken = nil, 0
}

// takeTurnText returns and clears the turn's streamed thought and
// assistant text, for the authoritative replay when the turn ends.
func (m *mapper) takeTurnText() (thought, text string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	thought, text = m.thought.String(), m.text.String()
	m.thought.Reset()
	m.text.Reset()
	return thought, text
}

// clearTurnText drops the turn's streamed text; a send calls it unless
// the agent queues prompts.
func (m *mapper) clearTurnText() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.thought.Reset()
	m.text.Reset()
}

// isAbsent reports whether a raw field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// malformed is the error payload for an update that cannot be read. The
// update is its data: as JSON when it is JSON, else as a string.
func malformed(kind, problem string, raw []byte) []schemas.Payload {
	msg := "malformed " + kind + ": " + problem
	if json.Valid(raw) {
		return []schemas.Payload{schemas.ErrorWith(msg, json.RawMessage(raw))}
	}
	return []schemas.Payload{schemas.ErrorWith(msg, string(raw))}
}
