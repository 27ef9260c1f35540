package claude

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// fastDelta decodes the line the CLI prints most, a streamed text,
// thinking or tool input delta:
//
//	{"type":"stream_event","event":{"delta":{"text":"…","type":"text_delta"},"index":0,"type":"content_block_delta"},"session_id":"…","parent_tool_use_id":null,"uuid":"…"}
//
// in one pass over its bytes, with the keys in any order. It reports
// false for any other line, for a key it does not know (which the full
// decoder may read differently: encoding/json matches keys without
// regard to case), and for anything that is not valid JSON: the full
// decoder then reads the line, so the two never disagree.
func (d *Decoder) fastDelta(b []byte) (schemas.Payload, bool) {
	var typ, evType, deltaType []byte // compared, not kept
	var text, thinking, partial string
	index := 0
	top := objectOf(b)
	for top.next() {
		var ok bool
		switch string(top.key) {
		case "type":
			typ, ok = plainString(top.val)
		case "event":
			ok = true
			ev := objectOf(top.val)
			for ok && ev.next() {
				switch string(ev.key) {
				case "type":
					evType, ok = plainString(ev.val)
				case "index":
					index, ok = jsonInt(ev.val)
				case "delta":
					delta := objectOf(ev.val)
					for ok && delta.next() {
						switch string(delta.key) {
						case "type":
							deltaType, ok = plainString(delta.val)
						case "text":
							text, ok = jsonString(delta.val)
						case "thinking":
							thinking, ok = jsonString(delta.val)
						case "partial_json":
							partial, ok = jsonString(delta.val)
						default:
							ok = false
						}
					}
					ok = ok && delta.whole()
				default:
					ok = false
				}
			}
			ok = ok && ev.whole()
		case "session_id", "uuid":
			ok = top.val[0] == '"' // skipValue has checked it
		case "parent_tool_use_id":
			ok = top.val[0] == '"' || string(top.val) == "null"
		}
		if !ok {
			return nil, false
		}
	}
	if !top.whole() || string(typ) != "stream_event" || string(evType) != "content_block_delta" {
		return nil, false
	}
	switch string(deltaType) {
	case "text_delta":
		return schemas.AssistantText{Delta: true, Content: schemas.Text(text)}, true
	case "thinking_delta":
		return schemas.Thought{Delta: true, Content: schemas.Text(thinking)}, true
	case "input_json_delta":
		return schemas.ToolInputDelta{ToolCallID: d.toolIDs[index], PartialJSON: partial}, true
	}
	return nil, false
}

// object walks the members of the JSON object that is all of b: each
// next gives a key (without its quotes; a key with an escape stops the
// walk) and its raw value. whole reports, once next is false, whether
// the walk reached the object's end with nothing after it.
type object struct {
	b        []byte
	i        int
	key, val []byte
	done     bool // the closing brace was reached
	bad      bool
}

func objectOf(b []byte) object {
	o := object{b: b}
	o.i = skipSpace(b, 0)
	if o.i == len(b) || b[o.i] != '{' {
		o.bad = true
		return o
	}
	o.i = skipSpace(b, o.i+1)
	if o.i < len(b) && b[o.i] == '}' {
		o.done = true
		o.i++
	}
	return o
}

func (o *object) next() bool {
	if o.bad || o.done {
		return false
	}
	b, i := o.b, o.i
	if i == len(b) || b[i] != '"' {
		o.bad = true
		return false
	}
	end, escaped := stringEnd(b, i)
	if end < 0 || escaped {
		o.bad = true // no key Shoal reads has an escape in it
		return false
	}
	o.key = b[i+1 : end-1]
	i = skipSpace(b, end)
	if i == len(b) || b[i] != ':' {
		o.bad = true
		return false
	}
	i = skipSpace(b, i+1)
	vEnd := skipValue(b, i, 0)
	if vEnd < 0 {
		o.bad = true
		return false
	}
	o.val = b[i:vEnd]
	i = skipSpace(b, vEnd)
	switch {
	case i < len(b) && b[i] == ',':
		o.i = skipSpace(b, i+1)
	case i < len(b) && b[i] == '}':
		o.i, o.done = i+1, true
	default:
		o.bad = true
		return false
	}
	return true
}

func (o *object) whole() bool {
	return o.done && !o.bad && skipSpace(o.b, o.i) == len(o.b)
}

// maxDepth bounds how deeply skipValue follows nested values.
const maxDepth = 64

// skipValue returns where the JSON value starting at b[i] ends, or -1
// when there is no valid value there.
func skipValue(b []byte, i, depth int) int {
	if i >= len(b) || depth > maxDepth {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		end, _ := stringEnd(b, i)
		return end
	case c == '{', c == '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1
				}
				end, _ := stringEnd(b, i)
				if end < 0 {
					return -1
				}
				i = skipSpace(b, end)
				if i >= len(b) || b[i] != ':' {
					return -1
				}
				i = skipSpace(b, i+1)
			}
			i = skipValue(b, i, depth+1)
			if i < 0 {
				return -1
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case ',':
				i = skipSpace(b, i+1)
			case closer:
				return i + 1
			default:
				return -1
			}
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	default:
		return numberEnd(b, i)
	}
}

func literal(b []byte, i int, word string) int {
	if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
		return i + len(word)
	}
	return -1
}

// numberEnd returns where the JSON number at b[i] ends, or -1.
func numberEnd(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digitsEnd(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digitsEnd(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digitsEnd(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digitsEnd(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// stringEnd returns where the JSON string at b[i] (its opening quote)
// ends, just past the closing quote, and whether it holds an escape; -1
// when it is not a valid string.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for i++; i < len(b); i++ {
		for i < len(b) && !stringSpecial[b[i]] {
			i++ // the bulk of a string: bytes that end or escape nothing
		}
		if i == len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			i++
			if i == len(b) {
				return -1, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i < 5 || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return -1, false
				}
				i += 4
			default:
				return -1, false
			}
		case c < 0x20:
			return -1, false
		}
	}
	return -1, false
}

// stringSpecial marks the bytes a JSON string's scan stops at: its quote,
// an escape, and control characters, which must be escaped.
var stringSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// jsonString decodes the JSON string that is all of v, as encoding/json
// would; false when v is not a string.
func jsonString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	end, escaped := stringEnd(v, 0)
	if end != len(v) {
		return "", false
	}
	if !escaped && utf8.Valid(v[1:end-1]) {
		return string(v[1 : end-1]), true
	}
	var s string // escapes, or bytes encoding/json replaces
	return s, json.Unmarshal(v, &s) == nil
}

// plainString is the content of the JSON string that is all of v, when
// it has no escapes and is UTF-8 (so it reads as it is); false otherwise.
func plainString(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	end, escaped := stringEnd(v, 0)
	if end != len(v) || escaped || !utf8.Valid(v[1:end-1]) {
		return nil, false
	}
	return v[1 : end-1], true
}

// jsonInt decodes the JSON integer that is all of v, as encoding/json
// decodes one into an int; false for anything else.
func jsonInt(v []byte) (int, bool) {
	if numberEnd(v, 0) != len(v) || len(v) == 0 || len(v) > 15 {
		return 0, false
	}
	digits, neg := v, v[0] == '-'
	if neg {
		digits = v[1:]
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false // a fraction or an exponent
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
