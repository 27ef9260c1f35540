package bridge_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
)

// Every bound tools/list advertises is the bound the server enforces: for
// each argument of each tool, a value past each of its patterns, lengths,
// ranges and counts is refused, in Kaimon's wording, naming the argument
// and the bound exactly as the advertised schema states it.
func TestMCPEnforcesEveryAdvertisedBound(t *testing.T) {
	t.Parallel()
	fb := startFabric(t, bridge.HTTPConfig{})
	s := fb.client(nil)
	tools, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	args := advertisedArgs(t, s)
	checked := map[string]int{}
	for _, tl := range tools.Tools {
		b, _ := json.Marshal(tl.InputSchema)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		for name, p := range schema.Properties {
			num := func(k string) (float64, bool) { f, ok := p[k].(float64); return f, ok }
			type row struct {
				value any
				want  string
			}
			var rows []row
			_, hasPattern := p["pattern"].(string)
			if pat, ok := p["pattern"].(string); ok {
				rows = append(rows, row{"Bad Name", fmt.Sprintf("%s must match %s, not %q", name, pat, "Bad Name")})
				checked["pattern"]++
			}
			if n, ok := num("minLength"); ok {
				want := fmt.Sprintf("%s must be at least %d characters long, not %d", name, int(n), int(n)-1)
				if n == 1 {
					want = name + " must not be empty"
				}
				rows = append(rows, row{strings.Repeat("a", int(n)-1), want})
				checked["minLength"]++
			}
			if n, ok := num("maxLength"); ok && !hasPattern {
				rows = append(rows, row{strings.Repeat("a", int(n)+1), fmt.Sprintf("%s must be at most %d characters long, not %d", name, int(n), int(n)+1)})
				checked["maxLength"]++
			}
			if n, ok := num("minimum"); ok {
				rows = append(rows, row{n - 1, fmt.Sprintf("%s must be at least %v, not %v", name, n, n-1)})
				checked["minimum"]++
			}
			if n, ok := num("exclusiveMinimum"); ok {
				rows = append(rows, row{n, fmt.Sprintf("%s must be more than %v, not %v", name, n, n)})
				checked["exclusiveMinimum"]++
			}
			if n, ok := num("maximum"); ok {
				rows = append(rows, row{n + 1, fmt.Sprintf("%s must be at most %v, not %v", name, n, n+1)})
				checked["maximum"]++
			}
			if _, bounded := num("maximum"); p["type"] == "integer" && !bounded {
				// A number no Go integer holds reached the decoder,
				// whose own words answered (an outside review).
				rows = append(rows, row{1e300, fmt.Sprintf("%s must be an integer of at most 64 bits, written in digits, not 1e+300", name)})
				checked["integer range"]++
			}
			if n, ok := num("maxItems"); ok {
				many := make([]any, int(n)+1)
				for i := range many {
					many[i] = "a"
				}
				rows = append(rows, row{many, fmt.Sprintf("%s may have at most %d entries, not %d", name, int(n), int(n)+1)})
				checked["maxItems"]++
			}
			if items, ok := p["items"].(map[string]any); ok {
				if n, ok := items["maxLength"].(float64); ok {
					rows = append(rows, row{[]any{strings.Repeat("a", int(n)+1)}, fmt.Sprintf("%s has an entry that is %d characters long (at most %d)", name, int(n)+1, int(n))})
					checked["items.maxLength"]++
				}
			}
			if n, ok := num("maxProperties"); ok {
				many := map[string]any{}
				for i := range int(n) + 1 {
					many[fmt.Sprintf("k%d", i)] = "v"
				}
				rows = append(rows, row{many, fmt.Sprintf("%s may have at most %d entries, not %d", name, int(n), int(n)+1)})
				checked["maxProperties"]++
			}
			if add, ok := p["additionalProperties"].(map[string]any); ok {
				if n, ok := add["maxLength"].(float64); ok {
					rows = append(rows, row{map[string]any{"k": strings.Repeat("a", int(n)+1)}, fmt.Sprintf("%s has an entry that is %d characters long (at most %d)", name, int(n)+1, int(n))})
					checked["additionalProperties.maxLength"]++
				}
			}
			for _, r := range rows {
				in := validArgs(args[tl.Name])
				in[name] = r.value
				text, isErr := call(t, s, tl.Name, in)
				if want := "Invalid parameter(s): " + r.want; !isErr || text != want {
					t.Errorf("%s with %s past its bound:\n got %q\nwant %q", tl.Name, name, text, want)
				}
			}
		}
	}
	for _, k := range []string{"pattern", "minLength", "maxLength", "minimum", "exclusiveMinimum", "maximum", "integer range", "maxItems", "items.maxLength", "maxProperties", "additionalProperties.maxLength"} {
		if checked[k] == 0 {
			t.Errorf("no advertised argument has a %s: the test checked nothing of it", k)
		}
	}
	t.Logf("bounds checked: %v", checked)
}
