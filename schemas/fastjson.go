package schemas

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// appendEnvelope writes the envelopes of the kinds that make up most of a
// stream (streamed text and thought chunks, tool input fragments, status)
// without reflection. The bytes are exactly encoding/json's.
func appendEnvelope(b []byte, e Event) ([]byte, bool) {
	switch p := e.Payload.(type) {
	case AssistantText:
		return appendChunk(b, "assistant_text", e.Turn, p.Delta, p.Content)
	case Thought:
		return appendChunk(b, "thought", e.Turn, p.Delta, p.Content)
	case ToolInputDelta:
		b = appendHead(b, "tool_input_delta", e.Turn)
		b = append(b, `{"toolCallId":`...)
		b = AppendJSONString(b, p.ToolCallID)
		b = append(b, `,"partialJson":`...)
		b = AppendJSONString(b, p.PartialJSON)
		return append(b, "}}"...), true
	case Status:
		if p.Sandbox != nil {
			return nil, false // rare: the reflective encoder writes it
		}
		b = appendHead(b, "status", e.Turn)
		b = append(b, `{"status":`...)
		b = AppendJSONString(b, string(p.Status))
		return append(b, "}}"...), true
	case TurnStarted:
		b = appendHead(b, "turn_started", e.Turn)
		return append(b, "{}}"...), true
	}
	return b, false
}

func appendHead(b []byte, kind string, turn int) []byte {
	b = append(b, `{"kind":"`...)
	b = append(b, kind...)
	b = append(b, `","turn":`...)
	b = strconv.AppendInt(b, int64(turn), 10)
	return append(b, `,"data":`...)
}

func appendChunk(b []byte, kind string, turn int, delta bool, c ContentBlock) ([]byte, bool) {
	if c.Type != ContentText {
		return b, false
	}
	b = appendHead(b, kind, turn)
	b = append(b, `{"delta":`...)
	b = strconv.AppendBool(b, delta)
	b = append(b, `,"content":{"type":"text","text":`...)
	b = AppendJSONString(b, c.Text)
	return append(b, "}}}"...), true
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string the way encoding/json
// does: HTML-safe, invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029
// escaped.
func AppendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeFast reads the canonical envelopes appendEnvelope writes for
// streamed chunks, tool input fragments, status and turn starts, without
// building a map per object. It reports false for anything else, which
// the full decoder then reads.
func decodeFast(b []byte) (Event, bool) {
	if len(b) < 30 || string(b[:9]) != `{"kind":"` {
		return Event{}, false
	}
	rest := b[9:]
	var kind string
	for _, k := range []string{"assistant_text", "thought", "tool_input_delta", "status", "turn_started"} {
		if len(rest) > len(k)+10 && string(rest[:len(k)]) == k && string(rest[len(k):len(k)+9]) == `","turn":` {
			kind, rest = k, rest[len(k)+9:]
			break
		}
	}
	if kind == "" {
		return Event{}, false
	}
	turn, rest, ok := cutInt(rest)
	if !ok || !hasPrefix(rest, `,"data":`) {
		return Event{}, false
	}
	rest = rest[len(`,"data":`):]
	switch kind {
	case "turn_started":
		if string(rest) == "{}}" {
			return Event{Turn: turn, Payload: TurnStarted{}}, true
		}
	case "status":
		s, rest, ok := cutField(rest, `{"status":`)
		if ok && string(rest) == "}}" && AgentStatus(s).Published() {
			return Event{Turn: turn, Payload: Status{Status: AgentStatus(s)}}, true
		}
	case "tool_input_delta":
		id, rest, ok := cutField(rest, `{"toolCallId":`)
		if !ok {
			break
		}
		frag, rest, ok := cutField(rest, `,"partialJson":`)
		if ok && string(rest) == "}}" {
			return Event{Turn: turn, Payload: ToolInputDelta{ToolCallID: id, PartialJSON: frag}}, true
		}
	default:
		var delta bool
		switch {
		case hasPrefix(rest, `{"delta":true`):
			delta, rest = true, rest[len(`{"delta":true`):]
		case hasPrefix(rest, `{"delta":false`):
			rest = rest[len(`{"delta":false`):]
		default:
			return Event{}, false
		}
		text, rest, ok := cutField(rest, `,"content":{"type":"text","text":`)
		if !ok || string(rest) != "}}}" {
			break
		}
		if kind == "thought" {
			return Event{Turn: turn, Payload: Thought{Delta: delta, Content: Text(text)}}, true
		}
		return Event{Turn: turn, Payload: AssistantText{Delta: delta, Content: Text(text)}}, true
	}
	return Event{}, false
}

func hasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

func cutInt(b []byte) (int, []byte, bool) {
	n, i := 0, 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' && i < 9 {
		n = n*10 + int(b[i]-'0')
		i++
	}
	return n, b[i:], i > 0 && (i == 1 || b[0] != '0')
}

// cutField reads prefix then a JSON string, returning it unquoted.
func cutField(b []byte, prefix string) (string, []byte, bool) {
	if !hasPrefix(b, prefix) {
		return "", nil, false
	}
	b = b[len(prefix):]
	if len(b) == 0 || b[0] != '"' {
		return "", nil, false
	}
	escaped := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '\\':
			escaped = true
			i++
		case c == '"':
			if !escaped {
				if !utf8.Valid(b[1:i]) {
					return "", nil, false
				}
				return string(b[1:i]), b[i+1:], true
			}
			var s string
			if err := json.Unmarshal(b[:i+1], &s); err != nil {
				return "", nil, false
			}
			return s, b[i+1:], true
		case c < 0x20:
			return "", nil, false
		}
	}
	return "", nil, false
}

// Peek reads an envelope's kind, turn and whether it is a delta from the
// front of its canonical encoding, without decoding the rest; for any
// other encoding it decodes the envelope.
func Peek(b []byte) (kind Kind, turn int, delta bool, err error) {
	if hasPrefix(b, `{"kind":"`) {
		rest := b[9:]
		if i := indexByte(rest, '"'); i > 0 && hasPrefix(rest[i:], `","turn":`) {
			k := Kind(rest[:i])
			t, after, ok := cutInt(rest[i+9:])
			if ok && hasPrefix(after, `,"data":`) {
				after = after[len(`,"data":`):]
				switch k {
				case KindToolInputDelta:
					return k, t, true, nil
				case KindAssistantText, KindThought:
					return k, t, hasPrefix(after, `{"delta":true`), nil
				}
				if _, known := newPayload(k); known {
					return k, t, false, nil
				}
			}
		}
	}
	ev, err := Decode(b)
	if err != nil {
		return "", 0, false, err
	}
	return ev.Kind(), ev.Turn, ev.IsDelta(), nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}
