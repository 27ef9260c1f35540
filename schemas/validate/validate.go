// Package validate checks requests against the JSON Schema files package
// schemas embeds, with a kept JSON Schema library, before anything is
// built from them: every type, enum, pattern, length and bound the files
// say is enforced, and a problem is worded Kaimon's way (unknown, missing,
// then invalid parameters, each named).
//
// It is the one validator of every edge: the MCP tools (whose tools/list
// advertises exactly the schema Request.Schema returns), the coordinator's
// fabric service and the nodes' control service. It is apart from
// schemas, which imports only the standard library.
package validate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/shoalfabric/shoal/schemas"
)

// Request is one control request's schema: compiled for validation, and
// self-contained (its references inlined) for those who advertise it.
type Request struct {
	name     string
	raw      json.RawMessage
	kinds    map[string]string // top-level property → its kind, for wording
	names    []string          // sorted
	compiled *jsonschema.Schema
}

// Caller is the request schema name (schemas/jsonschema/control/<name>.json)
// as a caller may send it: what Shoal sets itself (the properties marked
// readOnly, such as an open's parent and depth) is no argument, and is
// refused as any unknown one is.
func Caller(name string) (*Request, error) { return load(name, true) }

// Full is the request schema name as one part of the fabric sends it to
// another, Shoal's own fields included.
func Full(name string) (*Request, error) { return load(name, false) }

var (
	mu    sync.Mutex
	cache = map[string]*Request{}
)

func load(name string, caller bool) (*Request, error) {
	key := fmt.Sprintf("%s/%v", name, caller)
	mu.Lock()
	defer mu.Unlock()
	if r, ok := cache[key]; ok {
		return r, nil
	}
	doc, err := inlined(name)
	if err != nil {
		return nil, err
	}
	props, _ := doc["properties"].(map[string]any)
	if caller {
		for k, v := range props {
			if ro, _ := v.(map[string]any)["readOnly"].(bool); ro {
				delete(props, k)
			}
		}
	}
	r := &Request{name: name, kinds: map[string]string{}}
	if r.raw, err = json.Marshal(doc); err != nil {
		return nil, err
	}
	for k, v := range props {
		r.kinds[k] = kindOf(v.(map[string]any))
		r.names = append(r.names, k)
	}
	slices.Sort(r.names)
	c := jsonschema.NewCompiler()
	res, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.raw))
	if err != nil {
		return nil, err
	}
	url := "mem:///" + key + ".json"
	if err := c.AddResource(url, res); err != nil {
		return nil, fmt.Errorf("request schema %s: %w", name, err)
	}
	if r.compiled, err = c.Compile(url); err != nil {
		return nil, fmt.Errorf("request schema %s: %w", name, err)
	}
	cache[key] = r
	return r, nil
}

// MustCaller is Caller for schemas that are part of the binary: a failure
// is a bug.
func MustCaller(name string) *Request {
	r, err := Caller(name)
	if err != nil {
		panic(err)
	}
	return r
}

// MustFull is Full for schemas that are part of the binary.
func MustFull(name string) *Request {
	r, err := Full(name)
	if err != nil {
		panic(err)
	}
	return r
}

// Schema is the request's schema, self-contained: what an MCP tool
// advertises as its input schema.
func (r *Request) Schema() json.RawMessage { return r.raw }

// Names are the request's arguments, sorted.
func (r *Request) Names() []string { return r.names }

// Problem is a request that does not fit its schema, in Kaimon's words.
type Problem struct {
	Unknown []string // arguments the schema does not know
	Missing []string // required arguments absent (or null)
	Invalid []string // "<arg> must be …, not …"
	valid   []string
	whole   string // the request is not an object at all
}

func (p *Problem) Error() string {
	if p.whole != "" {
		return p.whole
	}
	var msgs []string
	if len(p.Unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("Unknown parameter(s): %s. Valid parameters are: %s", strings.Join(p.Unknown, ", "), strings.Join(p.valid, ", ")))
	}
	if len(p.Missing) > 0 {
		msgs = append(msgs, "Missing required parameter(s): "+strings.Join(p.Missing, ", "))
	}
	if len(p.Invalid) > 0 {
		msgs = append(msgs, "Invalid parameter(s): "+strings.Join(p.Invalid, "; "))
	}
	return strings.Join(msgs, ". ")
}

// MaxValues bounds the JSON values a request may hold. A request is
// decoded whole before its schema is checked, and a value decoded costs
// far more than its bytes: 8 MiB of empty objects held 171 MiB. No
// request of the fabric needs more: the largest is a permission answered
// with a tool's input, at most 1 MiB (schemas.MaxPermitBytes), which
// holds at most this many values; a long text is one value.
const MaxValues = 1 << 19

// CheckValues refuses raw if it holds more than MaxValues JSON values,
// without decoding it.
func CheckValues(raw []byte) error {
	if values(raw, MaxValues) > MaxValues {
		return &Problem{whole: fmt.Sprintf("the request holds more than %d JSON values, more than any request needs", MaxValues)}
	}
	return nil
}

// values counts the JSON values in raw, past the first, as the commas,
// colons and opening brackets outside strings that begin them; it stops
// counting past limit.
func values(raw []byte, limit int) int {
	n, inString, escaped := 0, false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == ',' || c == ':' || c == '[' || c == '{':
			if n++; n > limit {
				return n
			}
		}
	}
	return n
}

// Check validates raw (a JSON object) and returns it as it was checked:
// with top-level nulls removed, which mean the same as absent. A problem
// is a *Problem.
func (r *Request) Check(raw []byte) (json.RawMessage, error) {
	if err := CheckValues(raw); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &Problem{whole: fmt.Sprintf("the request is not JSON: %v", err)}
	}
	if dec.More() {
		return nil, &Problem{whole: "the request has trailing data after its JSON object"}
	}
	args, ok := v.(map[string]any)
	if !ok {
		return nil, &Problem{whole: fmt.Sprintf("the request must be a JSON object, not %s", jsonType(v))}
	}
	for k, x := range args {
		if x == nil {
			delete(args, k)
		}
	}
	if err := r.compiled.Validate(args); err != nil {
		ve, ok := errors.AsType[*jsonschema.ValidationError](err)
		if !ok {
			return nil, &Problem{whole: err.Error()}
		}
		return nil, r.problem(ve, args)
	}
	// An integer the schema takes may still be one no Go integer holds
	// (1e300), or written with an exponent, which the decoder takes for
	// no integer: said here in the schema's words, not the decoder's.
	var invalid []string
	for _, k := range r.names {
		if n, ok := args[k].(json.Number); ok && r.kinds[k] == "integer" {
			if _, err := strconv.ParseInt(n.String(), 10, 64); err != nil {
				invalid = append(invalid, fmt.Sprintf("%s must be an integer of at most 64 bits, written in digits, not %s", k, n))
			}
		}
	}
	if invalid != nil {
		return nil, &Problem{Invalid: invalid, valid: r.names}
	}
	out, err := json.Marshal(args)
	return out, err
}

// Decode checks raw and decodes it into v.
func (r *Request) Decode(raw []byte, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	checked, err := r.Check(raw)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(checked, v); err != nil {
		return &Problem{whole: fmt.Sprintf("the request does not fit its type: %v", err)}
	}
	return nil
}

// ControlError is err as a control reply's error: a Problem is invalid.
func ControlError(err error) error {
	if p, ok := errors.AsType[*Problem](err); ok {
		return schemas.Errf(schemas.CodeInvalid, "%s", p.Error())
	}
	return err
}

// problem words a validation error: each leaf error is put on the
// top-level argument it lies under, and each argument is said once, by
// its most telling error.
func (r *Request) problem(ve *jsonschema.ValidationError, args map[string]any) *Problem {
	p := &Problem{valid: r.names}
	best := map[string]leaf{}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		switch k := e.ErrorKind.(type) {
		case *kind.AdditionalProperties:
			if len(e.InstanceLocation) == 0 {
				p.Unknown = append(p.Unknown, k.Properties...)
				return
			}
		case *kind.Required:
			if len(e.InstanceLocation) == 0 {
				p.Missing = append(p.Missing, k.Missing...)
				return
			}
		}
		if len(e.InstanceLocation) == 0 {
			p.Invalid = append(p.Invalid, fmt.Sprint(e.ErrorKind))
			return
		}
		arg := e.InstanceLocation[0]
		l := leaf{rank: rank(e.ErrorKind), kind: e.ErrorKind, nested: len(e.InstanceLocation) > 1}
		if old, ok := best[arg]; !ok || l.rank < old.rank {
			best[arg] = l
		}
	}
	walk(ve)
	for _, arg := range slices.Sorted(maps.Keys(best)) {
		p.Invalid = append(p.Invalid, r.say(arg, args[arg], best[arg]))
	}
	slices.Sort(p.Unknown)
	p.Unknown = slices.Compact(p.Unknown)
	slices.Sort(p.Missing)
	p.Missing = slices.Compact(p.Missing)
	return p
}

type leaf struct {
	rank   int
	kind   jsonschema.ErrorKind
	nested bool
}

// rank orders errors by how much they say: a wrong type first.
func rank(k jsonschema.ErrorKind) int {
	switch k.(type) {
	case *kind.Type:
		return 0
	case *kind.Enum, *kind.Const:
		return 1
	case *kind.Pattern:
		return 2
	case *kind.MinLength, *kind.MaxLength, *kind.MinItems, *kind.MaxItems, *kind.MinProperties, *kind.MaxProperties:
		return 3
	}
	return 4
}

// say words one argument's error.
func (r *Request) say(arg string, v any, l leaf) string {
	if l.nested {
		switch l.kind.(type) {
		case *kind.Type, *kind.AdditionalProperties:
			return fmt.Sprintf("%s must be %s, not %s", arg, kindWords(r.kinds[arg]), entryOf(r.kinds[arg], v))
		}
		return fmt.Sprintf("%s has an entry that %s", arg, entryWords(l.kind))
	}
	switch k := l.kind.(type) {
	case *kind.Type:
		return fmt.Sprintf("%s must be %s, not %s", arg, kindWords(r.kinds[arg]), jsonType(v))
	case *kind.Enum:
		var want []string
		for _, w := range k.Want {
			want = append(want, fmt.Sprint(w))
		}
		return fmt.Sprintf("%s must be one of %s, not %s", arg, strings.Join(want, ", "), quoted(v))
	case *kind.Pattern:
		return fmt.Sprintf("%s must match %s, not %s", arg, k.Want, quoted(v))
	case *kind.MinLength:
		if k.Want == 1 {
			return fmt.Sprintf("%s must not be empty", arg)
		}
		return fmt.Sprintf("%s must be at least %d characters long, not %d", arg, k.Want, k.Got)
	case *kind.MaxLength:
		return fmt.Sprintf("%s must be at most %d characters long, not %d", arg, k.Want, k.Got)
	case *kind.MaxItems:
		return fmt.Sprintf("%s may have at most %d entries, not %d", arg, k.Want, k.Got)
	case *kind.MaxProperties:
		return fmt.Sprintf("%s may have at most %d entries, not %d", arg, k.Want, k.Got)
	case *kind.Minimum:
		return fmt.Sprintf("%s must be at least %s, not %s", arg, rat(k.Want), number(v))
	case *kind.ExclusiveMinimum:
		return fmt.Sprintf("%s must be more than %s, not %s", arg, rat(k.Want), number(v))
	case *kind.Maximum:
		return fmt.Sprintf("%s must be at most %s, not %s", arg, rat(k.Want), number(v))
	case *kind.ExclusiveMaximum:
		return fmt.Sprintf("%s must be less than %s, not %s", arg, rat(k.Want), number(v))
	}
	return fmt.Sprintf("%s is invalid: %v", arg, l.kind)
}

// entryWords says what is wrong with an entry of an array or object.
func entryWords(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Pattern:
		return "does not match " + k.Want
	case *kind.MinLength:
		return "is empty"
	case *kind.MaxLength:
		return fmt.Sprintf("is %d characters long (at most %d)", k.Got, k.Want)
	}
	return fmt.Sprint(k)
}

// kindOf is how a property's type reads in a message.
func kindOf(m map[string]any) string {
	t, _ := m["type"].(string)
	switch {
	case t == "" && m["enum"] != nil:
		return "string"
	case t == "array":
		items, _ := m["items"].(map[string]any)
		if it, _ := items["type"].(string); it != "" {
			return it + "[]"
		}
		return "array"
	case t == "object":
		if add, ok := m["additionalProperties"].(map[string]any); ok && add["type"] == "string" {
			return "map"
		}
		return "object"
	}
	return t
}

func kindWords(k string) string {
	switch k {
	case "string[]":
		return "an array of strings"
	case "map":
		return "an object of strings"
	case "object":
		return "an object"
	case "array":
		return "an array"
	case "integer":
		return "an integer"
	case "":
		return "a value"
	}
	return "a " + k
}

// entryOf says what v, an argument of kind k with an entry of the wrong
// type, is: the first such entry of an array of strings or an object of
// strings, or else v as a whole.
func entryOf(k string, v any) string {
	switch x := v.(type) {
	case []any:
		if k == "string[]" {
			for i, e := range x {
				if _, ok := e.(string); !ok {
					return fmt.Sprintf("an array whose item %d is %s", i, jsonType(e))
				}
			}
		}
	case map[string]any:
		if k == "map" {
			keys := make([]string, 0, len(x))
			for key := range x {
				keys = append(keys, key)
			}
			slices.Sort(keys)
			for _, key := range keys {
				if _, ok := x[key].(string); !ok {
					return fmt.Sprintf("an object whose %q is %s", key, jsonType(x[key]))
				}
			}
		}
	}
	return jsonType(v)
}

// jsonType says what a decoded JSON value is.
func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "the number " + number(x)
	case float64:
		return "the number " + number(x)
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "null"
}

// number writes a JSON number as Go prints a float64 (1e+308, 1.5, 7).
func number(v any) string {
	switch x := v.(type) {
	case json.Number:
		if f, err := x.Float64(); err == nil {
			return fmt.Sprint(f)
		}
		return x.String()
	case float64:
		return fmt.Sprint(x)
	}
	return fmt.Sprint(v)
}

func rat(r *big.Rat) string {
	f, _ := r.Float64()
	return fmt.Sprint(f)
}

// quoted shows a value in a message; a long string by its length only.
func quoted(v any) string {
	s, ok := v.(string)
	if !ok {
		return jsonType(v)
	}
	if len(s) > 64 {
		return fmt.Sprintf("a string of %d characters", len(s))
	}
	return fmt.Sprintf("%q", s)
}

// inlined reads the request schema name with its references to defs.json
// replaced by what they name, and without its file identity.
func inlined(name string) (map[string]any, error) {
	raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/"+name+".json")
	if err != nil {
		return nil, fmt.Errorf("request schema %s: %w", name, err)
	}
	defsRaw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/defs.json")
	if err != nil {
		return nil, err
	}
	var doc, defs map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("request schema %s: %w", name, err)
	}
	if err := json.Unmarshal(defsRaw, &defs); err != nil {
		return nil, err
	}
	delete(doc, "$schema")
	delete(doc, "$id")
	out, err := inline(doc, defs["$defs"].(map[string]any))
	if err != nil {
		return nil, fmt.Errorf("request schema %s: %w", name, err)
	}
	return out.(map[string]any), nil
}

// inline replaces each {"$ref": "../defs.json#/$defs/X"} in v with X,
// keeping the referring node's own keys (a description, say).
func inline(v any, defs map[string]any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		if ref, ok := x["$ref"].(string); ok {
			name, ok := strings.CutPrefix(ref, "../defs.json#/$defs/")
			def, found := defs[name]
			if !ok || !found {
				return nil, fmt.Errorf("a $ref this reader cannot follow: %s", ref)
			}
			d, err := inline(def, defs)
			if err != nil {
				return nil, err
			}
			for k, dv := range d.(map[string]any) {
				out[k] = dv
			}
		}
		for k, c := range x {
			if k == "$ref" {
				continue
			}
			ic, err := inline(c, defs)
			if err != nil {
				return nil, err
			}
			out[k] = ic
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, c := range x {
			ic, err := inline(c, defs)
			if err != nil {
				return nil, err
			}
			out[i] = ic
		}
		return out, nil
	}
	return v, nil
}
