package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Readable is raw JSON as people read it: with &, < and > as themselves
// (JSON encoders write them as \u0026, \u003c and \u003e) and, with
// indent, two spaces a level. What does not decode comes back as it is.
func Readable(raw []byte, indent bool) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return string(raw)
	}
	return EscapeUnreadable(string(bytes.TrimRight(b.Bytes(), "\n")))
}

// EscapeUnreadable writes, in JSON text, the characters JSON leaves as
// they are but a terminal may act on (C1 controls: U+009B is a CSI to
// some) or show reordered (bidirectional overrides and isolates) as \u
// escapes, as JSON allows; the JSON means the same.
func EscapeUnreadable(out string) string {
	if strings.IndexFunc(out, unreadable) < 0 {
		return out
	}
	var e strings.Builder
	for _, r := range out {
		if unreadable(r) {
			fmt.Fprintf(&e, `\u%04x`, r)
		} else {
			e.WriteRune(r)
		}
	}
	return e.String()
}

// unreadable is a character Readable writes escaped.
func unreadable(r rune) bool {
	return (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}
