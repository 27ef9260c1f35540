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

// only returns a rule's from for every package but those under the given
// prefixes: the packages that may not import what only they may.
func only(prefixes ...string) func(string) bool {
	return func(p string) bool {
		for _, pre := range prefixes {
			if under(pre)(p) {
				return false
			}
		}
		return true
	}
}

// importsOf reports whether imp is the module path or beneath it.
func importsOf(module string) func(_, imp string) bool {
	return func(_, imp string) bool { return imp == module || strings.HasPrefix(imp, module+"/") }
}

// oursUnder reports whether imp is one of our packages under any prefix.
func oursUnder(prefixes ...string) func(_, imp string) bool {
	return func(_, imp string) bool {
		if !ours(imp) {
			return false
		}
		for _, pre := range prefixes {
			if under(pre)(rel(imp)) {
				return true
			}
		}
		return false
	}
}

var rules = []rule{
	{
		why:  "schemas imports only the standard library",
		from: func(p string) bool { return under("schemas")(p) && !under("schemas/validate")(p) },
		forbid: func(_, imp string) bool {
			first, _, _ := strings.Cut(imp, "/")
			return strings.Contains(first, ".")
		},
	},
	{
		why:  "schemas/validate imports only schemas of ours and the JSON Schema library",
		from: under("schemas/validate"),
		forbid: func(_, imp string) bool {
			first, _, _ := strings.Cut(imp, "/")
			return (ours(imp) && rel(imp) != "schemas") || (!ours(imp) && strings.Contains(first, ".") && !strings.HasPrefix(imp, "github.com/santhosh-tekuri/jsonschema/"))
		},
	},
	{
		why:    "node never imports bridge, coordinator or broker",
		from:   under("node"),
		forbid: oursUnder("bridge", "coordinator", "broker"),
	},
	{
		why:    "bridge never imports node, coordinator or broker",
		from:   under("bridge"),
		forbid: oursUnder("node", "coordinator", "broker"),
	},
	{
		why:    "coordinator never imports node, bridge or broker",
		from:   under("coordinator"),
		forbid: oursUnder("node", "bridge", "broker"),
	},
	{
		why:  "client imports only schemas, the wait notice of service and the git side of workspace of ours",
		from: under("client"),
		forbid: func(_, imp string) bool {
			return ours(imp) && rel(imp) != "schemas" && rel(imp) != "service" && rel(imp) != "workspace"
		},
	},
	{
		why:  "service, the request adapter, imports only schemas and schemas/validate of ours",
		from: under("service"),
		forbid: func(_, imp string) bool {
			return ours(imp) && rel(imp) != "schemas" && rel(imp) != "schemas/validate"
		},
	},
	{
		why:  "the backend contract imports only schemas and the process kit of ours",
		from: func(p string) bool { return p == "node/backend" },
		forbid: func(_, imp string) bool {
			return ours(imp) && rel(imp) != "schemas" && rel(imp) != "node/proc"
		},
	},
	{
		why:  "the process kit imports only schemas of ours",
		from: under("node/proc"),
		forbid: func(_, imp string) bool {
			return ours(imp) && rel(imp) != "schemas"
		},
	},
	{
		why:  "a backend imports only schemas, node/backend and node/proc of ours",
		from: isBackend,
		forbid: func(pkg, imp string) bool {
			if !ours(imp) {
				return false
			}
			r := rel(imp)
			own := strings.Join(strings.SplitN(pkg, "/", 4)[:3], "/") // node/backend/<kind>
			return r != "schemas" && r != "node/backend" && r != "node/proc" && !under(own)(r)
		},
	},
	{
		why:    "workspace, the git side of agents on a repository, imports only schemas of ours",
		from:   under("workspace"),
		forbid: func(_, imp string) bool { return ours(imp) && rel(imp) != "schemas" },
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
	{
		why:    "only broker imports the NATS server",
		from:   only("broker"),
		forbid: importsOf("github.com/nats-io/nats-server"),
	},
	{
		why:    "only bridge imports ZeroMQ",
		from:   only("bridge"),
		forbid: importsOf("github.com/go-zeromq"),
	},
	{
		why:    "only bridge serves MCP",
		from:   only("bridge"),
		forbid: importsOf("github.com/mark3labs/mcp-go/server"),
	},
	{
		why:    "only the process kit confines with Landlock",
		from:   only("node/proc"),
		forbid: importsOf("github.com/landlock-lsm/go-landlock"),
	},
	{
		why:    "only the local-model backend is an MCP client",
		from:   only("node/backend/local"),
		forbid: importsOf("github.com/mark3labs/mcp-go/client"),
	},
	{
		why:    "only the ACP backend speaks ACP",
		from:   only("node/backend/acp"),
		forbid: importsOf("github.com/coder/acp-go-sdk"),
	},
	{
		why:  "only the TUI imports the Charm libraries",
		from: only("cmd/shoal/internal/tui"),
		forbid: func(pkg, imp string) bool {
			return importsOf("github.com/charmbracelet")(pkg, imp) || importsOf("charm.land")(pkg, imp)
		},
	},
	{
		why:    "a browser drives the web dashboard in its tests only: no package imports chromedp",
		from:   func(string) bool { return true },
		forbid: importsOf("github.com/chromedp"),
	},
	{
		why:    "only the metrics package imports Prometheus's libraries",
		from:   only("cmd/shoal/internal/metrics"),
		forbid: importsOf("github.com/prometheus"),
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
	for _, pkg := range []string{"schemas", "schemas/validate", "service", "broker", "node", "node/backend", "node/proc", "client", "coordinator", "bridge", "bridge/web", "cmd/shoal", "cmd/shoal/internal/tui", "cmd/shoal/internal/metrics", "workspace"} {
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
		"node":                {m("bridge"), m("coordinator")},
		"node/supervise":      {m("broker")},
		"bridge":              {m("node"), m("coordinator")},
		"bridge/mcp":          {m("broker")},
		"coordinator":         {m("node"), m("bridge"), m("broker")},
		"client":              {m("node"), m("coordinator")},
		"service":             {m("client"), m("node")},
		"node/backend":        {m("node")},
		"node/backend/claude": {m("node/backend/acp"), m("node"), "github.com/landlock-lsm/go-landlock/landlock"},
		"node/proc":           {m("node/backend"), m("node")},
		"broker":              {m("node")},
		"node/backend/local":  {m("internal/fakemodel"), "github.com/mark3labs/mcp-go/server"},
		"internal/natstest":   {m("cmd/shoal"), "github.com/nats-io/nats-server/v2/server"},
		"client/x":            {"github.com/go-zeromq/zmq4"},
		"node/backend/acp":    {"github.com/mark3labs/mcp-go/client"},
		"bridge/acp":          {"github.com/coder/acp-go-sdk"},
		"cmd/shoal":           {"github.com/charmbracelet/bubbletea", "charm.land/bubbletea/v2"},
		"node/metrics":        {"github.com/prometheus/client_golang/prometheus"},
		"coordinator/x":       {"github.com/prometheus/common/expfmt"},
		"bridge/web":          {"github.com/chromedp/chromedp", m("node")},
	}
	got := violations(bad)
	if want := 35; len(got) != want {
		t.Fatalf("found %d violations, want %d:\n%s", len(got), want, strings.Join(got, "\n"))
	}
	fine := map[string][]string{
		"schemas":                    {"encoding/json", "fmt"},
		"node":                       {m("schemas"), m("node/backend"), m("client"), "github.com/nats-io/nats.go"},
		"node/backend/claude":        {m("schemas"), m("node/backend"), m("node/proc"), m("node/backend/claude/stream")},
		"node/backend":               {m("schemas"), m("node/proc")},
		"node/proc":                  {m("schemas"), "github.com/landlock-lsm/go-landlock/landlock"},
		"node/backend/local":         {m("schemas"), "github.com/mark3labs/mcp-go/client", "github.com/mark3labs/mcp-go/mcp"},
		"node/backend/acp":           {"github.com/coder/acp-go-sdk"},
		"client":                     {m("schemas"), "github.com/nats-io/nats.go/jetstream"},
		"coordinator":                {m("schemas"), m("client"), m("service"), "github.com/nats-io/nats.go/micro"},
		"service":                    {m("schemas"), m("schemas/validate"), "github.com/nats-io/nats.go/micro"},
		"bridge":                     {m("schemas"), m("client"), "github.com/mark3labs/mcp-go/server", "github.com/go-zeromq/zmq4"},
		"broker":                     {m("schemas"), "github.com/nats-io/nats-server/v2/server"},
		"cmd/shoal":                  {m("broker"), m("node"), m("bridge"), m("coordinator"), m("internal/natstest")},
		"cmd/shoal/internal/tui":     {"charm.land/bubbletea/v2", "charm.land/lipgloss/v2", "github.com/charmbracelet/x/ansi"},
		"cmd/shoal/internal/metrics": {"github.com/prometheus/client_golang/prometheus", m("schemas")},
		"internal/fabrictest":        {m("broker"), m("node"), m("bridge"), m("coordinator")},
		"bridge/web":                 {m("client"), m("schemas"), "embed", "net/http"},
	}
	if got := violations(fine); len(got) != 0 {
		t.Fatalf("allowed imports reported:\n%s", strings.Join(got, "\n"))
	}
}
