package schemas

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// appendEnvelope writes the envelopes of the kinds that make up most of a
// stream (streamed text and thought chunks, tool input fragments, status)
// without reflection. The bytes are exactly what the other kinds' path
// writes (encoding/json's, made Kaimon's by kaimonJSON).
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

// AppendJSONString appends s as a JSON string the way Kaimon's writer
// (JSON.jl) writes one: '"' and '\\' escaped, control characters too
// (\b \f \n \r \t by name, the rest of C0 and DEL as \u00xx), and
// every other character as it is, '<', '>', '&', U+2028 and U+2029
// included. Invalid UTF-8 is written as U+FFFD (Kaimon would pass the
// bytes on, which not every reader of JSON takes).
func AppendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != 0x7f {
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
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// kaimonJSON rewrites JSON that encoding/json wrote as Kaimon's writer
// writes it (see AppendJSONString): the characters encoding/json escapes
// and Kaimon does not ('<', '>', '&', U+2028, U+2029) as they are, and DEL,
// which encoding/json leaves, escaped. An escaped backslash is passed
// over whole, so "\\u003c" stays as it is.
func kaimonJSON(b []byte) []byte {
	if bytes.IndexByte(b, '\\') < 0 && bytes.IndexByte(b, 0x7f) < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == 0x7f:
			out = append(out, "\\u007f"...)
		case c == '\\' && i+1 < len(b):
			if b[i+1] == 'u' && i+5 < len(b) {
				if r, ok := kaimonRaw[string(b[i+2:i+6])]; ok {
					out = utf8.AppendRune(out, r)
					i += 5
					continue
				}
			}
			out = append(out, c, b[i+1])
			i++
		default:
			out = append(out, c)
		}
	}
	return out
}

// kaimonRaw are the \u escapes of encoding/json that Kaimon writes as the
// characters themselves.
var kaimonRaw = map[string]rune{"003c": '<', "003e": '>', "0026": '&', "2028": '\u2028', "2029": '\u2029'}

// appendJuliaFloat appends f as Julia shows a Float64, which is how
// Kaimon's writer writes one: the shortest digits that read back as f,
// always with a point (0.0, 1.5, 100000.0), and with an exponent below
// 0.0001 or from 1,000,000 on (1.0e-5, 1.234567e6).
func appendJuliaFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return append(b, "null"...) // no JSON number; no cost is one
	case math.Signbit(f):
		b = append(b, '-')
		f = -f
	}
	if f == 0 {
		return append(b, "0.0"...)
	}
	mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	digits := strings.Replace(mant, ".", "", 1)
	e, _ := strconv.Atoi(exp)
	pt := e + 1 // the point's place: f is 0.<digits> × 10^pt
	if pt <= -4 || pt > 6 {
		b = append(b, digits[0], '.')
		if len(digits) == 1 {
			b = append(b, '0')
		} else {
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		return strconv.AppendInt(b, int64(pt-1), 10)
	}
	switch {
	case pt <= 0:
		b = append(b, "0."...)
		b = append(b, strings.Repeat("0", -pt)...)
		return append(b, digits...)
	case pt >= len(digits):
		b = append(b, digits...)
		b = append(b, strings.Repeat("0", pt-len(digits))...)
		return append(b, ".0"...)
	}
	b = append(b, digits[:pt]...)
	b = append(b, '.')
	return append(b, digits[pt:]...)
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
