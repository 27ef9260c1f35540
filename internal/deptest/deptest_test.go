package deptest

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/shoalfabric/shoal"

// rule forbids a set of packages from importing another set.
type rule struct {
	why    string
	from   func(pkg string) bool
	forbid func(pkg, imp string) bool
}

func under(prefix string) func(string) bool {
	return func(p string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }
}

func ours(imp string) bool { return imp == module || strings.HasPrefix(imp, module+"/") }

func rel(imp string) string { return strings.TrimPrefix(strings.TrimPrefix(imp, module), "/") }

// isBackend reports whether pkg is a backend implementation.
func isBackend(pkg string) bool { return strings.HasPrefix(pkg, "node/backend/") }

var rules = []rule{
	{
		why:  "schemas imports only the standard library",
		from: under("schemas"),
		forbid: func(_, imp string) bool {
			first, _, _ := strings.Cut(imp, "/")
			return strings.Contains(first, ".")
		},
	},
	{
		why:    "node never imports bridge or broker",
		from:   under("node"),
		forbid: func(_, imp string) bool { return ours(imp) && (under("bridge")(rel(imp)) || under("broker")(rel(imp))) },
	},
	{
		why:    "bridge never imports node or broker",
		from:   under("bridge"),
		forbid: func(_, imp string) bool { return ours(imp) && (under("node")(rel(imp)) || under("broker")(rel(imp))) },
	},
	{
		why:  "the backend interface package imports only schemas of ours",
		from: func(p string) bool { return p == "node/backend" },
		forbid: func(_, imp string) bool {
			return ours(imp) && rel(imp) != "schemas"
		},
	},
	{
		why:  "a backend imports only schemas and node/backend of ours",
		from: isBackend,
		forbid: func(pkg, imp string) bool {
			if !ours(imp) {
				return false
			}
			r := rel(imp)
			own := strings.Join(strings.SplitN(pkg, "/", 4)[:3], "/") // node/backend/<kind>
			return r != "schemas" && r != "node/backend" && !under(own)(r)
		},
	},
	{
		why:    "broker imports only schemas of ours",
		from:   under("broker"),
		forbid: func(_, imp string) bool { return ours(imp) && rel(imp) != "schemas" },
	},
	{
		why:    "production packages never import the test helpers in internal/",
		from:   func(p string) bool { return !under("cmd")(p) && !under("internal")(p) },
		forbid: func(_, imp string) bool { return ours(imp) && under("internal")(rel(imp)) },
	},
	{
		why:    "nothing outside cmd/ imports cmd/",
		from:   func(p string) bool { return !under("cmd")(p) },
		forbid: func(_, imp string) bool { return ours(imp) && under("cmd")(rel(imp)) },
	},
}

// violations checks a graph of package (relative to the module) → imports.
func violations(graph map[string][]string) []string {
	var out []string
	pkgs := make([]string, 0, len(graph))
	for p := range graph {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		for _, imp := range graph[p] {
			for _, r := range rules {
				if r.from(p) && r.forbid(p, imp) {
					out = append(out, p+" imports "+imp+": "+r.why)
				}
			}
		}
	}
	return out
}

// importGraph reads the non-test imports of every package in the module,
// for every platform (build tags are ignored, so a darwin-only file is
// held to the same rules).
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	graph := map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(dir)
		for _, s := range f.Imports {
			imp, _ := strconv.Unquote(s.Path.Value)
			if !slices.Contains(graph[pkg], imp) {
				graph[pkg] = append(graph[pkg], imp)
			}
		}
		if _, ok := graph[pkg]; !ok {
			graph[pkg] = nil
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return graph
}

func TestDependencyDirection(t *testing.T) {
	graph := importGraph(t)
	for _, pkg := range []string{"schemas", "broker", "node", "node/backend", "bridge", "cmd/shoal"} {
		if _, ok := graph[pkg]; !ok {
			t.Errorf("package %s is missing from the layout", pkg)
		}
	}
	for _, v := range violations(graph) {
		t.Error(v)
	}
}

// The rules catch each kind of forbidden import.
func TestRulesCatchViolations(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	bad := map[string][]string{
		"schemas":             {"github.com/nats-io/nats.go"},
		"node":                {m("bridge")},
		"node/supervise":      {m("broker")},
		"bridge":              {m("node")},
		"bridge/mcp":          {m("broker")},
		"node/backend":        {m("node")},
		"node/backend/claude": {m("node/backend/acp"), m("node")},
		"broker":              {m("node")},
		"node/backend/llm":    {m("internal/fakemodel")},
		"internal/natstest":   {m("cmd/shoal")},
	}
	got := violations(bad)
	if want := 12; len(got) != want {
		t.Fatalf("found %d violations, want %d:\n%s", len(got), want, strings.Join(got, "\n"))
	}
	fine := map[string][]string{
		"schemas":             {"encoding/json", "fmt"},
		"node":                {m("schemas"), m("node/backend"), "github.com/nats-io/nats.go"},
		"node/backend/claude": {m("schemas"), m("node/backend"), m("node/backend/claude/stream")},
		"bridge":              {m("schemas"), "github.com/mark3labs/mcp-go/server"},
		"cmd/shoal":           {m("broker"), m("node"), m("bridge"), m("internal/natstest")},
		"internal/fabrictest": {m("broker"), m("node"), m("bridge")},
	}
	if got := violations(fine); len(got) != 0 {
		t.Fatalf("allowed imports reported:\n%s", strings.Join(got, "\n"))
	}
}
