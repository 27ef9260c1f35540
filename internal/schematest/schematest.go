// Package schematest validates JSON against the schema files embedded in
// package schemas. Every test that produces events or control messages
// runs them through here, so the files and the code cannot drift apart.
package schematest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/shoalfabric/shoal/schemas"
)

var (
	compileOnce sync.Once
	compiled    map[string]*jsonschema.Schema
	compileErr  error
)

// compileAll compiles every embedded schema once, keyed by its path under
// jsonschema/ without the .json suffix ("envelope", "kinds/result",
// "control/open_request").
func compileAll() (map[string]*jsonschema.Schema, error) {
	compileOnce.Do(func() {
		c := jsonschema.NewCompiler()
		var names []string
		compileErr = fs.WalkDir(schemas.JSONSchemas, "jsonschema", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(schemas.JSONSchemas, p)
			if err != nil {
				return err
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			rel := strings.TrimPrefix(p, "jsonschema/")
			if err := c.AddResource(schemas.JSONSchemaBase+rel, doc); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			names = append(names, strings.TrimSuffix(rel, ".json"))
			return nil
		})
		if compileErr != nil {
			return
		}
		compiled = make(map[string]*jsonschema.Schema, len(names))
		for _, n := range names {
			s, err := c.Compile(schemas.JSONSchemaBase + n + ".json")
			if err != nil {
				compileErr = fmt.Errorf("compile %s: %w", n, err)
				return
			}
			compiled[n] = s
		}
	})
	return compiled, compileErr
}

// Validate checks raw JSON against the named schema ("envelope",
// "control/open_request", …).
func Validate(name string, raw []byte) error {
	all, err := compileAll()
	if err != nil {
		return err
	}
	s, ok := all[name]
	if !ok {
		return fmt.Errorf("no schema named %q", name)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(doc)
}

// ValidateEvent checks an envelope against envelope.json and against the
// Go decoder, so an event must satisfy both descriptions of the contract.
func ValidateEvent(raw []byte) error {
	if err := Validate("envelope", raw); err != nil {
		return err
	}
	if _, err := schemas.Decode(raw); err != nil {
		return err
	}
	return nil
}

// Event fails the test when raw is not a valid envelope.
func Event(tb testing.TB, raw []byte) {
	tb.Helper()
	if err := ValidateEvent(raw); err != nil {
		tb.Fatalf("invalid event %s: %v", raw, err)
	}
}

// Control fails the test when raw does not match the named control schema
// ("open_request", "agent_record", …).
func Control(tb testing.TB, name string, raw []byte) {
	tb.Helper()
	if err := Validate("control/"+name, raw); err != nil {
		tb.Fatalf("invalid %s %s: %v", name, raw, err)
	}
}

// ControlValue fails the test when v, encoded as JSON, does not match the
// named control schema: for a reply a test holds as a Go value, such as
// what a bridge.Fabric method returned.
func ControlValue(tb testing.TB, name string, v any) {
	tb.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("encode %s %+v: %v", name, v, err)
	}
	Control(tb, name, raw)
}
