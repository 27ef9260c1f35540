package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// FieldError reports a malformed envelope or message: which field, by its
// dotted path from the root ("data.content.type", "data.call.content[2]"),
// and what is wrong with it.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Problem
	}
	return "field " + strconv.Quote(e.Field) + ": " + e.Problem
}

// fields reads one JSON object with a sticky first error, so decoders read
// as a list of the keys they need. Nested readers share the error.
type fields struct {
	path string
	m    map[string]json.RawMessage
	err  *error
}

// decodeInto reads b as an object and hands it to fn, returning the first
// problem any read found.
func decodeInto(b []byte, fn func(*fields)) error {
	var err error
	f := newFields("", b, &err)
	if f != nil {
		fn(f)
	}
	return err
}

func newFields(path string, b []byte, err *error) *fields {
	f := &fields{path: path, err: err}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		f.setErr(path, "want a JSON object, got "+describe(b))
		return nil
	}
	if e := json.Unmarshal(b, &f.m); e != nil {
		f.setErr(path, "invalid JSON: "+e.Error())
		return nil
	}
	return f
}

func (f *fields) at(key string) string {
	if f.path == "" {
		return key
	}
	return f.path + "." + key
}

func (f *fields) setErr(field, problem string) {
	if *f.err == nil {
		*f.err = &FieldError{Field: field, Problem: problem}
	}
}

// fail records a problem with key.
func (f *fields) fail(key, problem string) { f.setErr(f.at(key), problem) }

func (f *fields) present(key string) bool {
	_, ok := f.m[key]
	return ok
}

func (f *fields) isNull(key string) bool {
	v, ok := f.m[key]
	return ok && string(bytes.TrimSpace(v)) == "null"
}

// get returns the raw value of a key that must be present.
func (f *fields) get(key string) (json.RawMessage, bool) {
	v, ok := f.m[key]
	if !ok {
		f.fail(key, "missing")
	}
	return v, ok
}

// str reads a required string.
func (f *fields) str(key string) string {
	v, ok := f.get(key)
	if !ok {
		return ""
	}
	return f.decodeStr(key, v)
}

// optStr reads a string that may be absent or null.
func (f *fields) optStr(key string) string {
	if !f.present(key) || f.isNull(key) {
		return ""
	}
	return f.decodeStr(key, f.m[key])
}

func (f *fields) decodeStr(key string, v json.RawMessage) string {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		f.fail(key, "want a string, got "+describe(v))
	}
	return s
}

// bool reads a boolean; an absent key is false unless required.
func (f *fields) bool(key string, required bool) bool {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail(key, "missing")
		}
		return false
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		f.fail(key, "want true or false, got "+describe(v))
	}
	return b
}

// int reads a required integer.
func (f *fields) int(key string) int64 {
	v, ok := f.get(key)
	if !ok {
		return 0
	}
	return f.decodeInt(key, v)
}

func (f *fields) decodeInt(key string, v json.RawMessage) int64 {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
	if err != nil {
		f.fail(key, "want an integer, got "+describe(v))
	}
	return n
}

// count reads a required non-negative integer.
func (f *fields) count(key string) int64 {
	n := f.int(key)
	if n < 0 {
		f.fail(key, fmt.Sprintf("must not be negative, got %d", n))
	}
	return n
}

// optInt reads an integer that may be absent or null.
func (f *fields) optInt(key string) *int {
	if !f.present(key) || f.isNull(key) {
		return nil
	}
	n := int(f.decodeInt(key, f.m[key]))
	return &n
}

// optFloat reads a number that may be absent or null.
func (f *fields) optFloat(key string) *float64 {
	if !f.present(key) || f.isNull(key) {
		return nil
	}
	var x float64
	if err := json.Unmarshal(f.m[key], &x); err != nil {
		f.fail(key, "want a number, got "+describe(f.m[key]))
		return nil
	}
	return &x
}

// raw returns any JSON value, or nil when the key is absent (an error when
// required).
func (f *fields) raw(key string, required bool) json.RawMessage {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail(key, "missing")
		}
		return nil
	}
	return append(json.RawMessage(nil), bytes.TrimSpace(v)...)
}

// object reads a required nested object.
func (f *fields) object(key string, fn func(*fields)) {
	if v, ok := f.get(key); ok {
		if g := newFields(f.at(key), v, f.err); g != nil {
			fn(g)
		}
	}
}

// array reads an array of objects, calling fn for each element.
func (f *fields) array(key string, required bool, fn func(int, *fields)) {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail(key, "missing")
		}
		return
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(v, &elems); err != nil || string(bytes.TrimSpace(v)) == "null" {
		f.fail(key, "want an array, got "+describe(v))
		return
	}
	for i, e := range elems {
		if g := newFields(fmt.Sprintf("%s[%d]", f.at(key), i), e, f.err); g != nil {
			fn(i, g)
		}
	}
}

// describe names the JSON type of v for error messages.
func describe(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "the number " + string(v)
}
