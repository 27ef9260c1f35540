package bridge

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// inputSchema is a tool's arguments as the embedded request schema
// (schemas/jsonschema/control/<name>.json) says them: made self-contained
// for MCP clients (its $refs to defs.json inlined, its file identity
// dropped), and read for validation. A new argument is one edit to the
// request type and its schema.
type inputSchema struct {
	raw      json.RawMessage
	props    map[string]property
	names    []string // sorted
	required []string
}

// property is what validation reads of one argument.
type property struct {
	kind     string // "string", "number", "integer", "boolean", "string[]", "map" (of strings), "object"
	enum     []string
	min, max *float64
	exclMin  bool
}

// loadSchema reads the embedded request schema name.
func loadSchema(name string) (inputSchema, error) {
	raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/"+name+".json")
	if err != nil {
		return inputSchema{}, fmt.Errorf("request schema %s: %w", name, err)
	}
	defsRaw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/defs.json")
	if err != nil {
		return inputSchema{}, err
	}
	var doc, defs map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return inputSchema{}, fmt.Errorf("request schema %s: %w", name, err)
	}
	if err := json.Unmarshal(defsRaw, &defs); err != nil {
		return inputSchema{}, err
	}
	delete(doc, "$schema")
	delete(doc, "$id")
	inlined, err := inline(doc, defs["$defs"].(map[string]any))
	if err != nil {
		return inputSchema{}, fmt.Errorf("request schema %s: %w", name, err)
	}
	doc = inlined.(map[string]any)
	// What Shoal sets itself (readOnly) is no argument: not shown, and
	// refused from a caller as any unknown one is.
	props, _ := doc["properties"].(map[string]any)
	for k, v := range props {
		if ro, _ := v.(map[string]any)["readOnly"].(bool); ro {
			delete(props, k)
		}
	}
	s := inputSchema{props: map[string]property{}}
	s.raw, _ = json.Marshal(doc)
	for _, r := range asSlice(doc["required"]) {
		s.required = append(s.required, r.(string))
	}
	for k, v := range props {
		p, err := readProperty(v.(map[string]any))
		if err != nil {
			return inputSchema{}, fmt.Errorf("request schema %s: %s: %w", name, k, err)
		}
		s.props[k] = p
		s.names = append(s.names, k)
	}
	slices.Sort(s.names)
	return s, nil
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

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func readProperty(m map[string]any) (property, error) {
	var p property
	for _, e := range asSlice(m["enum"]) {
		p.enum = append(p.enum, fmt.Sprint(e))
	}
	t, _ := m["type"].(string)
	switch {
	case t == "" && p.enum != nil, t == "string":
		p.kind = "string"
	case t == "number", t == "integer", t == "boolean":
		p.kind = t
	case t == "array":
		items, _ := m["items"].(map[string]any)
		if items["type"] != "string" {
			return p, fmt.Errorf("an array of something other than strings")
		}
		p.kind = "string[]"
	case t == "object" && m["additionalProperties"] == nil:
		p.kind = "object" // any object: a tool's input
	case t == "object":
		add, _ := m["additionalProperties"].(map[string]any)
		if add["type"] != "string" {
			return p, fmt.Errorf("an object of something other than strings")
		}
		p.kind = "map"
	default:
		return p, fmt.Errorf("a type this reader does not know: %v", m["type"])
	}
	num := func(k string) *float64 {
		if f, ok := m[k].(float64); ok {
			return &f
		}
		return nil
	}
	p.min, p.max = num("minimum"), num("maximum")
	if e := num("exclusiveMinimum"); e != nil {
		p.min, p.exclMin = e, true
	}
	return p, nil
}

// validate checks a call's arguments the way Kaimon words it (unknown and
// missing ones), plus their types, enums and numeric bounds, which Kaimon
// left unchecked. Null is the same as absent.
func (s inputSchema) validate(raw map[string]any) string {
	var unknown, missing, wrong []string
	for k := range raw {
		if _, ok := s.props[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	for _, name := range s.names {
		p := s.props[name]
		v, ok := raw[name]
		switch {
		case !ok || v == nil:
			if slices.Contains(s.required, name) {
				missing = append(missing, name)
			}
			delete(raw, name)
		case !typeOK(p.kind, v):
			wrong = append(wrong, fmt.Sprintf("%s must be %s, not %s", name, kindName(p.kind), jsonType(v)))
		case p.enum != nil && !slices.Contains(p.enum, v.(string)):
			wrong = append(wrong, fmt.Sprintf("%s must be one of %s, not %q", name, strings.Join(p.enum, ", "), v))
		case p.min != nil && (v.(float64) < *p.min || p.exclMin && v.(float64) == *p.min):
			bound := "at least"
			if p.exclMin {
				bound = "more than"
			}
			wrong = append(wrong, fmt.Sprintf("%s must be %s %v, not %v", name, bound, *p.min, v))
		case p.max != nil && v.(float64) > *p.max:
			wrong = append(wrong, fmt.Sprintf("%s must be at most %v, not %v", name, *p.max, v))
		}
	}
	slices.Sort(unknown)
	slices.Sort(missing)
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("Unknown parameter(s): %s. Valid parameters are: %s", strings.Join(unknown, ", "), strings.Join(s.names, ", ")))
	}
	if len(missing) > 0 {
		msgs = append(msgs, "Missing required parameter(s): "+strings.Join(missing, ", "))
	}
	if len(wrong) > 0 {
		msgs = append(msgs, "Invalid parameter(s): "+strings.Join(wrong, "; "))
	}
	return strings.Join(msgs, ". ")
}

func typeOK(kind string, v any) bool {
	switch kind {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == float64(int64(f))
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string[]":
		xs, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range xs {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "map":
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, x := range m {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	}
	return false
}

func kindName(kind string) string {
	switch kind {
	case "string[]":
		return "an array of strings"
	case "map":
		return "an object of strings"
	case "object":
		return "an object"
	case "integer":
		return "an integer"
	}
	return "a " + kind
}

func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "a string"
	case float64:
		if x == float64(int64(x)) {
			return "the number " + fmt.Sprint(int64(x))
		}
		return "the number " + fmt.Sprint(x)
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "null"
}
