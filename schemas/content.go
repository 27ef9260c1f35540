package schemas

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Content block types.
const (
	ContentText         = "text"
	ContentImage        = "image"
	ContentAudio        = "audio"
	ContentResourceLink = "resource_link"
	ContentResource     = "resource"
)

// ContentBlock is one piece of message content. Type selects which fields
// are meaningful and which keys the JSON form carries:
//
//	text           {"type","text"}
//	image          {"type","data","mimeType","uri"}        uri null when empty
//	audio          {"type","data","mimeType"}
//	resource_link  {"type","uri","name","mimeType"}        mimeType null when empty
//	resource       {"type","uri","text","blob","mimeType"} text, blob, mimeType null when empty
type ContentBlock struct {
	Type     string
	Text     string
	Data     string // base64, for image and audio
	MimeType string
	URI      string
	Name     string
	Blob     string // base64, for resource
}

// Text returns a text content block.
func Text(s string) ContentBlock { return ContentBlock{Type: ContentText, Text: s} }

// Image returns an image content block with base64 data.
func Image(data, mimeType string) ContentBlock {
	return ContentBlock{Type: ContentImage, Data: data, MimeType: mimeType}
}

// MarshalJSON writes exactly the keys of the block's type.
func (c ContentBlock) MarshalJSON() ([]byte, error) {
	switch c.Type {
	case ContentText:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{c.Type, c.Text})
	case ContentImage:
		return json.Marshal(struct {
			Type     string  `json:"type"`
			Data     string  `json:"data"`
			MimeType string  `json:"mimeType"`
			URI      *string `json:"uri"`
		}{c.Type, c.Data, c.MimeType, nullable(c.URI)})
	case ContentAudio:
		return json.Marshal(struct {
			Type     string `json:"type"`
			Data     string `json:"data"`
			MimeType string `json:"mimeType"`
		}{c.Type, c.Data, c.MimeType})
	case ContentResourceLink:
		return json.Marshal(struct {
			Type     string  `json:"type"`
			URI      string  `json:"uri"`
			Name     string  `json:"name"`
			MimeType *string `json:"mimeType"`
		}{c.Type, c.URI, c.Name, nullable(c.MimeType)})
	case ContentResource:
		return json.Marshal(struct {
			Type     string  `json:"type"`
			URI      string  `json:"uri"`
			Text     *string `json:"text"`
			Blob     *string `json:"blob"`
			MimeType *string `json:"mimeType"`
		}{c.Type, c.URI, nullable(c.Text), nullable(c.Blob), nullable(c.MimeType)})
	}
	return nil, fmt.Errorf("content block: unknown type %q", c.Type)
}

// UnmarshalJSON decodes and checks a content block.
func (c *ContentBlock) UnmarshalJSON(b []byte) error {
	return decodeInto(b, c.decode)
}

func (c *ContentBlock) decode(f *fields) {
	*c = ContentBlock{Type: f.str("type")}
	switch c.Type {
	case ContentText:
		c.Text = f.str("text")
	case ContentImage:
		c.Data = f.str("data")
		c.MimeType = f.str("mimeType")
		c.URI = f.optStr("uri")
	case ContentAudio:
		c.Data = f.str("data")
		c.MimeType = f.str("mimeType")
	case ContentResourceLink:
		c.URI = f.str("uri")
		c.Name = f.str("name")
		c.MimeType = f.optStr("mimeType")
	case ContentResource:
		c.URI = f.str("uri")
		c.Text = f.optStr("text")
		c.Blob = f.optStr("blob")
		c.MimeType = f.optStr("mimeType")
	default:
		f.fail("type", fmt.Sprintf("unknown content type %q", c.Type))
	}
}

// Tool call content types.
const (
	ToolContentBlock    = "content"
	ToolContentDiff     = "diff"
	ToolContentTerminal = "terminal"
)

// ToolCallContent is what a tool call produced or proposes:
//
//	content   {"type":"content","content":<ContentBlock>}
//	diff      {"type":"diff","path","oldText","newText"}   oldText null for a new file
//	terminal  {"type":"terminal","terminalId"}
type ToolCallContent struct {
	Type       string
	Content    ContentBlock
	Path       string
	OldText    *string
	NewText    string
	TerminalID string
}

// ToolText wraps text as tool call content.
func ToolText(s string) ToolCallContent {
	return ToolCallContent{Type: ToolContentBlock, Content: Text(s)}
}

// ToolBlock wraps a content block as tool call content.
func ToolBlock(c ContentBlock) ToolCallContent {
	return ToolCallContent{Type: ToolContentBlock, Content: c}
}

// MarshalJSON writes exactly the keys of the content's type.
func (t ToolCallContent) MarshalJSON() ([]byte, error) {
	switch t.Type {
	case ToolContentBlock:
		return json.Marshal(struct {
			Type    string       `json:"type"`
			Content ContentBlock `json:"content"`
		}{t.Type, t.Content})
	case ToolContentDiff:
		return json.Marshal(struct {
			Type    string  `json:"type"`
			Path    string  `json:"path"`
			OldText *string `json:"oldText"`
			NewText string  `json:"newText"`
		}{t.Type, t.Path, t.OldText, t.NewText})
	case ToolContentTerminal:
		return json.Marshal(struct {
			Type       string `json:"type"`
			TerminalID string `json:"terminalId"`
		}{t.Type, t.TerminalID})
	}
	return nil, fmt.Errorf("tool call content: unknown type %q", t.Type)
}

// UnmarshalJSON decodes and checks tool call content.
func (t *ToolCallContent) UnmarshalJSON(b []byte) error {
	return decodeInto(b, t.decode)
}

func (t *ToolCallContent) decode(f *fields) {
	*t = ToolCallContent{Type: f.str("type")}
	switch t.Type {
	case ToolContentBlock:
		f.object("content", t.Content.decode)
	case ToolContentDiff:
		t.Path = f.str("path")
		if f.present("oldText") {
			old := f.optStr("oldText")
			if !f.isNull("oldText") {
				t.OldText = &old
			}
		}
		t.NewText = f.str("newText")
	case ToolContentTerminal:
		t.TerminalID = f.str("terminalId")
	default:
		f.fail("type", fmt.Sprintf("unknown tool call content type %q", t.Type))
	}
}

// Location is a file position a tool call touches.
type Location struct {
	Path string `json:"path"`
	Line *int   `json:"line"`
}

func (l *Location) decode(f *fields) {
	l.Path = f.str("path")
	l.Line = f.optInt("line")
}

// ToolCall is a tool invocation as carried by a tool_use event. Every key
// is always written; RawInput and RawOutput are null when unset.
type ToolCall struct {
	ToolCallID string
	Title      string
	Kind       ToolKind
	Status     ToolStatus
	Content    []ToolCallContent
	Locations  []Location
	RawInput   json.RawMessage
	RawOutput  json.RawMessage
}

// MarshalJSON writes every key, with empty arrays rather than null.
func (c ToolCall) MarshalJSON() ([]byte, error) {
	content, locations := c.Content, c.Locations
	if content == nil {
		content = []ToolCallContent{}
	}
	if locations == nil {
		locations = []Location{}
	}
	return json.Marshal(struct {
		ToolCallID string            `json:"toolCallId"`
		Title      string            `json:"title"`
		Kind       ToolKind          `json:"kind"`
		Status     ToolStatus        `json:"status"`
		Content    []ToolCallContent `json:"content"`
		Locations  []Location        `json:"locations"`
		RawInput   json.RawMessage   `json:"rawInput"`
		RawOutput  json.RawMessage   `json:"rawOutput"`
	}{c.ToolCallID, c.Title, ParseToolKind(string(c.Kind)), ParseToolStatus(string(c.Status)),
		content, locations, rawOrNull(c.RawInput), rawOrNull(c.RawOutput)})
}

// UnmarshalJSON decodes and checks a tool call.
func (c *ToolCall) UnmarshalJSON(b []byte) error { return decodeInto(b, c.decode) }

func (c *ToolCall) decode(f *fields) {
	*c = ToolCall{
		ToolCallID: f.str("toolCallId"),
		Title:      f.str("title"),
		Kind:       ParseToolKind(f.str("kind")),
		Status:     ParseToolStatus(f.str("status")),
		Content:    decodeToolContents(f, "content", true),
		Locations:  decodeLocations(f, "locations", true),
		RawInput:   nilIfNull(f.raw("rawInput", true)),
		RawOutput:  nilIfNull(f.raw("rawOutput", true)),
	}
}

// nilIfNull maps a JSON null to an unset RawMessage, which encodes back
// to null.
func nilIfNull(r json.RawMessage) json.RawMessage {
	if string(r) == "null" {
		return nil
	}
	return r
}

// ToolCallUpdate is a change to a tool call, as carried by a tool_result
// event. Only ToolCallID is required; every other field is written only
// when set (a nil pointer, slice or RawMessage is unset).
type ToolCallUpdate struct {
	ToolCallID string            `json:"toolCallId"`
	Title      *string           `json:"title,omitempty"`
	Kind       *ToolKind         `json:"kind,omitempty"`
	Status     *ToolStatus       `json:"status,omitempty"`
	Content    []ToolCallContent `json:"content,omitzero"`
	Locations  []Location        `json:"locations,omitzero"`
	RawInput   json.RawMessage   `json:"rawInput,omitzero"`
	RawOutput  json.RawMessage   `json:"rawOutput,omitzero"`
}

// UnmarshalJSON decodes and checks a tool call update.
func (u *ToolCallUpdate) UnmarshalJSON(b []byte) error { return decodeInto(b, u.decode) }

func (u *ToolCallUpdate) decode(f *fields) {
	*u = ToolCallUpdate{ToolCallID: f.str("toolCallId")}
	if f.present("title") {
		t := f.str("title")
		u.Title = &t
	}
	if f.present("kind") {
		k := ParseToolKind(f.optStr("kind"))
		u.Kind = &k
	}
	if f.present("status") {
		s := ParseToolStatus(f.optStr("status"))
		u.Status = &s
	}
	u.Content = decodeToolContents(f, "content", false)
	u.Locations = decodeLocations(f, "locations", false)
	u.RawInput = f.raw("rawInput", false)
	u.RawOutput = f.raw("rawOutput", false)
}

func decodeToolContents(f *fields, key string, required bool) []ToolCallContent {
	var out []ToolCallContent
	f.array(key, required, func(i int, g *fields) {
		var t ToolCallContent
		t.decode(g)
		out = append(out, t)
	})
	if out == nil && f.present(key) {
		out = []ToolCallContent{}
	}
	return out
}

func decodeLocations(f *fields, key string, required bool) []Location {
	var out []Location
	f.array(key, required, func(i int, g *fields) {
		var l Location
		l.decode(g)
		out = append(out, l)
	})
	if out == nil && f.present(key) {
		out = []Location{}
	}
	return out
}

// Usage is token and cost accounting for a turn or a session. CostUSD is
// null when no backend reported a cost.
type Usage struct {
	InputTokens         int64    `json:"inputTokens"`
	OutputTokens        int64    `json:"outputTokens"`
	CacheReadTokens     int64    `json:"cacheReadTokens"`
	CacheCreationTokens int64    `json:"cacheCreationTokens"`
	CostUSD             *float64 `json:"costUsd"`
}

// MarshalJSON writes the usage as Kaimon does: its cost a float as Julia
// shows one ("costUsd":0.0, not 0), or null.
func (u Usage) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128)
	b = append(b, `{"inputTokens":`...)
	b = strconv.AppendInt(b, u.InputTokens, 10)
	b = append(b, `,"outputTokens":`...)
	b = strconv.AppendInt(b, u.OutputTokens, 10)
	b = append(b, `,"cacheReadTokens":`...)
	b = strconv.AppendInt(b, u.CacheReadTokens, 10)
	b = append(b, `,"cacheCreationTokens":`...)
	b = strconv.AppendInt(b, u.CacheCreationTokens, 10)
	b = append(b, `,"costUsd":`...)
	if u.CostUSD == nil {
		b = append(b, "null"...)
	} else {
		b = appendJuliaFloat(b, *u.CostUSD)
	}
	return append(b, '}'), nil
}

// MaxTurnTokens and MaxTurnCostUSD bound each figure of one turn's usage
// as a backend reports it (a result, a running usage update): no turn
// uses a trillion tokens of a kind or a million dollars, and a figure past
// them is a node's or a CLI's mistake, which would otherwise take the
// fleet's count with it (the count is the sum of every turn's). A sum of
// turns (an agent's record, the coordinator's count) may pass them.
const (
	MaxTurnTokens  = 1 << 40
	MaxTurnCostUSD = 1e6
)

// Clamped is u held to what one turn can use: each token count within 0
// and MaxTurnTokens, a cost within 0 and MaxTurnCostUSD (a cost that is
// no number is none). ok says u was within them already. A backend's
// figures are its CLI's or its model server's word, which may be any
// number; held so, they decode wherever they are read.
func (u Usage) Clamped() (c Usage, ok bool) {
	ok = true
	hold := func(n int64) int64 {
		switch {
		case n < 0:
			ok = false
			return 0
		case n > MaxTurnTokens:
			ok = false
			return MaxTurnTokens
		}
		return n
	}
	c = Usage{InputTokens: hold(u.InputTokens), OutputTokens: hold(u.OutputTokens),
		CacheReadTokens: hold(u.CacheReadTokens), CacheCreationTokens: hold(u.CacheCreationTokens)}
	if u.CostUSD != nil {
		switch cost := *u.CostUSD; {
		case math.IsNaN(cost):
			ok = false
		case cost < 0:
			c.CostUSD, ok = Cost(0), false
		case cost > MaxTurnCostUSD:
			c.CostUSD, ok = Cost(MaxTurnCostUSD), false
		default:
			c.CostUSD = Cost(cost)
		}
	}
	return c, ok
}

// Add accumulates u into the receiver field-wise; a null cost counts as
// absent, so the sum is null only when both are. A sum saturates (at the
// largest int64, the largest finite float64) rather than wrapping, so it
// always encodes.
func (s *Usage) Add(u Usage) {
	s.InputTokens = addTokens(s.InputTokens, u.InputTokens)
	s.OutputTokens = addTokens(s.OutputTokens, u.OutputTokens)
	s.CacheReadTokens = addTokens(s.CacheReadTokens, u.CacheReadTokens)
	s.CacheCreationTokens = addTokens(s.CacheCreationTokens, u.CacheCreationTokens)
	if u.CostUSD != nil {
		sum := *u.CostUSD
		if s.CostUSD != nil {
			sum = addCost(sum, *s.CostUSD)
		}
		s.CostUSD = &sum
	}
}

// addTokens is a+b, held at the ends of int64 instead of wrapping.
func addTokens(a, b int64) int64 {
	sum := a + b
	switch {
	case a > 0 && b > 0 && sum < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && sum >= 0:
		return math.MinInt64
	}
	return sum
}

// addCost is a+b, held at the largest finite float64 (JSON has no
// infinity).
func addCost(a, b float64) float64 {
	sum := a + b
	switch {
	case math.IsInf(sum, 1):
		return math.MaxFloat64
	case math.IsInf(sum, -1):
		return -math.MaxFloat64
	}
	return sum
}

// Cost returns a pointer to c, for Usage.CostUSD.
func Cost(c float64) *float64 { return &c }

// decode reads a usage record: tokens are counts, and a cost, when there
// is one, is not negative.
func (s *Usage) decode(f *fields) {
	*s = Usage{
		InputTokens:         f.count("inputTokens"),
		OutputTokens:        f.count("outputTokens"),
		CacheReadTokens:     f.count("cacheReadTokens"),
		CacheCreationTokens: f.count("cacheCreationTokens"),
		CostUSD:             f.optFloat("costUsd"),
	}
	if s.CostUSD != nil && !(*s.CostUSD >= 0) { // NaN too
		f.fail("costUsd", fmt.Sprintf("a cost must not be negative, got %g", *s.CostUSD))
	}
}

// decodeTurn reads one turn's usage, as a backend reports it: a usage
// record whose figures are each within MaxTurnTokens and MaxTurnCostUSD.
func (s *Usage) decodeTurn(f *fields) {
	s.decode(f)
	for _, c := range []struct {
		key string
		n   int64
	}{{"inputTokens", s.InputTokens}, {"outputTokens", s.OutputTokens}, {"cacheReadTokens", s.CacheReadTokens}, {"cacheCreationTokens", s.CacheCreationTokens}} {
		if c.n > MaxTurnTokens {
			f.fail(c.key, fmt.Sprintf("a turn uses at most %d tokens of a kind (schemas.MaxTurnTokens), got %d", int64(MaxTurnTokens), c.n))
		}
	}
	if s.CostUSD != nil && *s.CostUSD > MaxTurnCostUSD {
		f.fail("costUsd", fmt.Sprintf("a turn's cost is at most $%g (schemas.MaxTurnCostUSD), got %g", float64(MaxTurnCostUSD), *s.CostUSD))
	}
}

// UnmarshalJSON decodes and checks a usage record.
func (s *Usage) UnmarshalJSON(b []byte) error { return decodeInto(b, s.decode) }

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}
