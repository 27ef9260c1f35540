package schemas

import (
	"bytes"
	"encoding/json"
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
	return string(bytes.TrimRight(b.Bytes(), "\n"))
}
