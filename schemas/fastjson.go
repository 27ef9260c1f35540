package schemas

import (
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
		b = appendString(b, p.ToolCallID)
		b = append(b, `,"partialJson":`...)
		b = appendString(b, p.PartialJSON)
		return append(b, "}}"...), true
	case Status:
		b = appendHead(b, "status", e.Turn)
		b = append(b, `{"status":`...)
		b = appendString(b, string(p.Status))
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
	b = appendString(b, c.Text)
	return append(b, "}}}"...), true
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string the way encoding/json does:
// HTML-safe, invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
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
