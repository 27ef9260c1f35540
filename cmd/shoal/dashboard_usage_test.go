package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/schemas"
)

// The dashboard's per-node and per-model token tables count what shoal
// usage counts: an id reopened brings the turns of its earlier life, which
// its record holds apart (usage_before), into both.
func TestDashboardTokensMatchUsage(t *testing.T) {
	t.Parallel()
	fake := fakemodel.Start(t, fakemodel.Config{Default: func(fakemodel.Request) fakemodel.Reply {
		return fakemodel.Reply{Text: "ok", Usage: fakemodel.Usage{Input: 100, Output: 20, CacheRead: 3, CacheCreation: 2}}
	}})
	dir := t.TempDir()
	env := append(peers.ClaudeEnv(filepath.Join(dir, "home"), fake.URL()), "XDG_DATA_HOME="+dir+"/data", "XDG_CACHE_HOME="+dir+"/cache")
	up := startShoal(t, dir, env, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--no-bus",
		"--claude", peers.Claude.Command(t)[0], "--node-name", "n")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	web := strings.TrimSuffix(strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint "), "/mcp")
	up.waitLine("shoal: node n ready")
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url}, args...)
		if code != 0 {
			t.Fatalf("shoal %v: exit %d\n%s%s\nshoal up said:\n%s", args, code, out, errOut, up.stderrText())
		}
		return strings.TrimSpace(out)
	}
	cwd := t.TempDir()
	id := must("open", cwd)
	must("run", id, "one")
	must("close", id)
	must("open", "--id", id, cwd)
	must("run", id, "two")

	usage := func(by string) map[string]schemas.Usage {
		var rep usageReport
		if err := json.Unmarshal([]byte(must("usage", "--by", by, "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		out := map[string]schemas.Usage{}
		for _, r := range rep.Rows {
			out[r.Key] = r.Usage
		}
		return out
	}
	byNode, byModel := usage("node"), usage("model")
	if got := byNode["n"].InputTokens; got != 200 {
		t.Fatalf("shoal usage --by node counts %d input tokens on n, want the two turns' 200", got)
	}
	fleet := func() (nodes, models map[string]schemas.Usage) {
		res, err := http.Get(web + "/api/fleet")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var f struct {
			ByNode  map[string]schemas.Usage `json:"tokens_by_node"`
			ByModel map[string]schemas.Usage `json:"tokens_by_model"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("GET /api/fleet: %s: %v", b, err)
		}
		return f.ByNode, f.ByModel
	}
	same := func(a, b map[string]schemas.Usage) bool {
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		return string(ja) == string(jb)
	}
	show := func(m map[string]schemas.Usage) string { b, _ := json.Marshal(m); return string(b) }
	// The coordinator counts the turns as they are stored: a moment after
	// shoal usage read them, at most.
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, models := fleet()
		if same(nodes, byNode) && same(models, byModel) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard's tokens per node %v and per model %v; shoal usage counts %v and %v", show(nodes), show(models), show(byNode), show(byModel))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
