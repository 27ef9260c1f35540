package client

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// Backends as nodes advertise them in shoal_nodes.
var (
	claudeReady = schemas.BackendInfo{Kind: "claude", Path: "/usr/local/bin/claude", Version: "2.1.197", Ready: true}
	claudeGone  = schemas.BackendInfo{Kind: "claude", Ready: false, Problem: "claude is not on PATH"}
	opencode    = schemas.BackendInfo{Kind: "acp", Agent: "opencode", Path: "/usr/local/bin/opencode", Ready: true}
	gemini      = schemas.BackendInfo{Kind: "acp", Agent: "gemini", Path: "/usr/local/bin/gemini", Ready: true}
	ollamaQwen  = schemas.BackendInfo{Kind: "ollama", Host: "http://127.0.0.1:11434", Models: []string{"qwen3:8b", "llama3:latest"}, Ready: true}
	ollamaOther = schemas.BackendInfo{Kind: "ollama", Host: "http://127.0.0.1:11434", Models: []string{"mistral:7b"}, Ready: true}
	ollamaDown  = schemas.BackendInfo{Kind: "ollama", Host: "http://127.0.0.1:11434", Ready: false, Problem: "no Ollama server at http://127.0.0.1:11434"}
	mlxQwen     = schemas.BackendInfo{Kind: "vmlx", Host: "http://127.0.0.1:8000", Models: []string{"mlx-community/Qwen3-4B-4bit"}, Ready: true}
	mlxOther    = schemas.BackendInfo{Kind: "vmlx", Host: "http://127.0.0.1:8000", Models: []string{"mlx-community/gemma-3-4b"}, Ready: true}
)

// nodeRec is a node record with no limit and no labels.
func nodeRec(name string, agents int, backends ...schemas.BackendInfo) schemas.NodeRecord {
	return schemas.NodeRecord{Name: name, Backends: backends, Agents: agents, Labels: map[string]string{}}
}

// placed runs placement and fails the test unless it chose want.
func placed(t *testing.T, nodes []schemas.NodeRecord, req schemas.OpenRequest, want string) {
	t.Helper()
	got, err := place(nodes, req)
	if err != nil || got != want {
		t.Errorf("place(model %q, node %q, labels %v) = %q, %v; want %q", req.Model, req.Node, req.Labels, got, err, want)
	}
}

// refused runs placement and fails the test unless it refused with code
// and a message holding every one of wants.
func refused(t *testing.T, nodes []schemas.NodeRecord, req schemas.OpenRequest, code schemas.ErrorCode, wants ...string) string {
	t.Helper()
	got, err := place(nodes, req)
	if err == nil {
		t.Errorf("place(model %q, node %q, labels %v) chose %q; want a refusal", req.Model, req.Node, req.Labels, got)
		return ""
	}
	if c := schemas.CodeOf(err); c != code {
		t.Errorf("place(model %q, node %q, labels %v): code %q, want %q (%v)", req.Model, req.Node, req.Labels, c, code, err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("place(model %q, node %q, labels %v): %q lacks %q", req.Model, req.Node, req.Labels, err, w)
		}
	}
	return err.Error()
}

// A model goes only to the nodes whose backends serve it. In each pool the
// one node that can serve the model is the busiest, so a filter that let
// any other through would be caught by the least-loaded choice.
func TestPlaceByModel(t *testing.T) {
	t.Parallel()
	pool := []schemas.NodeRecord{
		nodeRec("plain", 0, claudeReady),
		nodeRec("gpu-ollama", 5, claudeReady, ollamaQwen),
		nodeRec("other-ollama", 0, ollamaOther, gemini),
		nodeRec("down-ollama", 0, ollamaDown),
		nodeRec("mac", 7, mlxQwen),
		nodeRec("mac-other", 0, mlxOther),
		nodeRec("coder", 9, opencode),
		nodeRec("no-claude", 0, claudeGone, gemini),
	}
	pool[2].Agents = 1 // so acp:gemini has one least loaded node
	for _, c := range []struct {
		model, want string
	}{
		{"ollama:qwen3:8b", "gpu-ollama"},
		{"ollama:llama3:latest", "gpu-ollama"},
		// An untagged name stands for :latest.
		{"ollama:llama3", "gpu-ollama"},
		{"ollama:mistral:7b", "other-ollama"},
		{"vmlx:mlx-community/Qwen3-4B-4bit", "mac"},
		{"vmlx:mlx-community/gemma-3-4b", "mac-other"},
		{"acp:opencode", "coder"},
		// The ACP agent's own model does not change where it can run.
		{"acp:opencode:anthropic/claude-sonnet-5", "coder"},
		{"acp:gemini", "no-claude"}, // the less loaded of other-ollama and no-claude
		// Claude models, and the default, go where the claude CLI is ready.
		{"", "plain"},
		{"sonnet", "plain"},
		{"opus", "plain"},
		{"claude-opus-4-1", "plain"},
	} {
		placed(t, pool, schemas.OpenRequest{Model: c.model}, c.want)
	}

	// Claude agents where only the busiest node has claude ready.
	busy := []schemas.NodeRecord{nodeRec("a-no-claude", 0, claudeGone, ollamaQwen), nodeRec("b-ollama", 0, ollamaOther), nodeRec("c-claude", 50, claudeReady)}
	placed(t, busy, schemas.OpenRequest{Model: "sonnet"}, "c-claude")
	placed(t, busy, schemas.OpenRequest{}, "c-claude")

	// The :latest rule goes one way only: an untagged name is name:latest,
	// never another tag of the same name, and a tag is never a prefix.
	for _, model := range []string{"ollama:qwen3", "ollama:qwen3:8", "ollama:qwen3:8b-instruct", "ollama:llama3:8b", "ollama:mistral"} {
		refused(t, pool, schemas.OpenRequest{Model: model}, schemas.CodeUnavailable,
			fmt.Sprintf(`gpu-ollama: does not serve ollama model %q`, strings.TrimPrefix(model, "ollama:")),
			"down-ollama: cannot run ollama agents: no Ollama server at http://127.0.0.1:11434",
			"mac: cannot run ollama agents", "plain: cannot run ollama agents")
	}
	refused(t, pool, schemas.OpenRequest{Model: "vmlx:mlx-community/Llama-3-8B"}, schemas.CodeUnavailable,
		`mac: does not serve vmlx model "mlx-community/Llama-3-8B"`,
		`mac-other: does not serve vmlx model "mlx-community/Llama-3-8B"`,
		"gpu-ollama: cannot run vmlx agents", "coder: cannot run vmlx agents")
	refused(t, pool, schemas.OpenRequest{Model: "acp:claude"}, schemas.CodeUnavailable,
		"coder: cannot run acp:claude agents", "other-ollama: cannot run acp:claude agents", "plain: cannot run acp:claude agents")
	// A node whose claude is not ready says why.
	refused(t, []schemas.NodeRecord{nodeRec("no-claude", 0, claudeGone)}, schemas.OpenRequest{Model: "opus"}, schemas.CodeUnavailable,
		"no-claude: cannot run claude agents: claude is not on PATH")
}

// A request's labels must all be on the node, with the same values; a
// node may carry more.
func TestPlaceByLabels(t *testing.T) {
	t.Parallel()
	labelled := func(name string, agents int, labels map[string]string) schemas.NodeRecord {
		n := nodeRec(name, agents, claudeReady)
		n.Labels = labels
		return n
	}
	pool := []schemas.NodeRecord{
		labelled("bare", 0, nil),
		labelled("gpu-only", 1, map[string]string{"gpu": "yes"}),
		labelled("wrong-gpu", 2, map[string]string{"gpu": "no", "site": "lab"}),
		labelled("both", 8, map[string]string{"gpu": "yes", "site": "lab", "arch": "arm64"}),
	}
	placed(t, pool, schemas.OpenRequest{Labels: map[string]string{"gpu": "yes", "site": "lab"}}, "both")
	placed(t, pool, schemas.OpenRequest{Labels: map[string]string{"arch": "arm64"}}, "both")
	placed(t, pool, schemas.OpenRequest{Labels: map[string]string{"site": "lab"}}, "wrong-gpu")
	// No labels asked for: any node, so the least loaded.
	placed(t, pool, schemas.OpenRequest{}, "bare")
	placed(t, pool, schemas.OpenRequest{Labels: map[string]string{}}, "bare")

	msg := refused(t, pool, schemas.OpenRequest{Labels: map[string]string{"gpu": "yes", "site": "home"}}, schemas.CodeUnavailable,
		"bare: lacks label gpu=yes, lacks label site=home",
		"gpu-only: lacks label site=home",
		"wrong-gpu: has gpu=no, not yes, has site=lab, not home",
		"both: has site=lab, not home")
	if strings.Contains(msg, "gpu-only: lacks label gpu") {
		t.Errorf("a label the node has with the right value is reported missing: %q", msg)
	}
	// A label's value must match exactly, not by prefix or case.
	refused(t, pool, schemas.OpenRequest{Labels: map[string]string{"gpu": "Yes"}}, schemas.CodeUnavailable, "both: has gpu=yes, not Yes")
	// Labels and model are both required.
	refused(t, pool, schemas.OpenRequest{Model: "acp:opencode", Labels: map[string]string{"gpu": "yes"}}, schemas.CodeUnavailable,
		"both: cannot run acp:opencode agents")
}

// An explicit node is taken when it can run the agent, however loaded;
// when it cannot, is full or is absent, the error says which and why.
func TestPlaceExplicitNode(t *testing.T) {
	t.Parallel()
	full := nodeRec("full", 2, claudeReady)
	full.MaxAgents = 2
	gpu := nodeRec("gpu", 30, claudeReady, ollamaQwen)
	gpu.Labels = map[string]string{"gpu": "yes"}
	pool := []schemas.NodeRecord{nodeRec("idle", 0, claudeReady), gpu, full, nodeRec("mac", 0, mlxQwen)}

	placed(t, pool, schemas.OpenRequest{Node: "gpu"}, "gpu")
	placed(t, pool, schemas.OpenRequest{Node: "gpu", Model: "ollama:qwen3:8b", Labels: map[string]string{"gpu": "yes"}}, "gpu")
	placed(t, pool, schemas.OpenRequest{Node: "mac", Model: "vmlx:mlx-community/Qwen3-4B-4bit"}, "mac")

	refused(t, pool, schemas.OpenRequest{Node: "mac"}, schemas.CodeUnavailable, "node mac cannot take this agent: cannot run claude agents")
	refused(t, pool, schemas.OpenRequest{Node: "gpu", Model: "ollama:mistral:7b"}, schemas.CodeUnavailable,
		`node gpu cannot take this agent: does not serve ollama model "mistral:7b"`)
	refused(t, pool, schemas.OpenRequest{Node: "idle", Labels: map[string]string{"gpu": "yes"}}, schemas.CodeUnavailable,
		"node idle cannot take this agent: lacks label gpu=yes")
	refused(t, pool, schemas.OpenRequest{Node: "full"}, schemas.CodeUnavailable, "node full cannot take this agent: is full (2 of 2 agents)")
	refused(t, pool, schemas.OpenRequest{Node: "zeta"}, schemas.CodeNotFound, "no node named zeta is running (nodes: idle, gpu, full, mac)")
	refused(t, nil, schemas.OpenRequest{Node: "zeta"}, schemas.CodeNotFound, "no node named zeta is running (no node is running)")
}

// Among the nodes that fit, the least loaded share of its limit wins
// (agents/1000 for a node with none), then the first by name; the order
// the records come in does not matter.
func TestPlaceLeastLoaded(t *testing.T) {
	t.Parallel()
	limited := func(name string, agents, max int) schemas.NodeRecord {
		n := nodeRec(name, agents, claudeReady)
		n.MaxAgents = max
		return n
	}
	pools := []struct {
		nodes []schemas.NodeRecord
		want  string
	}{
		// 3/4, 2/10, 100/1000: the unlimited node is the least loaded.
		{[]schemas.NodeRecord{limited("a", 3, 4), limited("b", 2, 10), limited("c", 100, 0)}, "c"},
		// 3/4, 2/10, 300/1000.
		{[]schemas.NodeRecord{limited("c", 300, 0), limited("a", 3, 4), limited("b", 2, 10)}, "b"},
		{[]schemas.NodeRecord{limited("y", 1, 0), limited("x", 0, 3), limited("w", 1, 2)}, "x"},
		// A node that cannot run the agent never wins, however idle.
		{[]schemas.NodeRecord{nodeRec("idle-mac", 0, mlxQwen), limited("busy", 9, 10)}, "busy"},
	}
	for _, p := range pools {
		placed(t, p.nodes, schemas.OpenRequest{}, p.want)
	}
	// Many candidates: the one idle node wins wherever it sits.
	var many []schemas.NodeRecord
	for i := range 200 {
		many = append(many, limited(fmt.Sprintf("n%03d", i), 1+i%7, 10))
	}
	many[137].Agents = 0
	placed(t, many, schemas.OpenRequest{}, "n137")

	// Nodes as loaded as each other share the opens: opens made together
	// see the same loads, and must not all go to one node.
	tied := []schemas.NodeRecord{limited("z", 1, 4), limited("m", 3, 8), limited("k", 1, 4), limited("q", 0, 0), limited("r", 2, 8)}
	tied[3].Agents = 250 // 250/1000, the same share as 1/4
	got := map[string]int{}
	for range 400 {
		name, err := place(tied, schemas.OpenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got[name]++
	}
	if len(got) != 4 || got["m"] > 0 {
		t.Errorf("400 placements over four nodes at a quarter and one at 3/8 went %v", got)
	}
	for name, n := range got {
		if n < 50 {
			t.Errorf("node %s got %d of 400 placements among four tied nodes: %v", name, n, got)
		}
	}
}

// A node holds at most MaxAgents live agents; no limit means none.
func TestPlaceAgentLimit(t *testing.T) {
	t.Parallel()
	limited := func(name string, agents, max int) schemas.NodeRecord {
		n := nodeRec(name, agents, claudeReady)
		n.MaxAgents = max
		return n
	}
	placed(t, []schemas.NodeRecord{limited("room", 1, 2)}, schemas.OpenRequest{}, "room")
	placed(t, []schemas.NodeRecord{limited("full", 2, 2), limited("room", 9, 10)}, schemas.OpenRequest{}, "room")
	placed(t, []schemas.NodeRecord{limited("unlimited", 100000, 0)}, schemas.OpenRequest{}, "unlimited")
	refused(t, []schemas.NodeRecord{limited("full", 2, 2), limited("over", 5, 3)}, schemas.OpenRequest{}, schemas.CodeUnavailable,
		"full: is full (2 of 2 agents)", "over: is full (5 of 3 agents)")
	refused(t, []schemas.NodeRecord{limited("one", 1, 1)}, schemas.OpenRequest{Node: "one"}, schemas.CodeUnavailable,
		"node one cannot take this agent: is full (1 of 1 agents)")
}

// When nothing fits, the error names every node, each once, with why it
// was passed over; with no node at all it says how to start one.
func TestPlaceNothingFits(t *testing.T) {
	t.Parallel()
	full := nodeRec("full", 4, claudeReady)
	full.MaxAgents = 4
	full.Labels = map[string]string{"pool": "x"}
	lab := nodeRec("lab", 0, claudeReady)
	lab.Labels = map[string]string{"site": "lab"}
	nodes := []schemas.NodeRecord{nodeRec("alpha", 0, claudeGone), nodeRec("beta", 0, ollamaQwen), full, lab, nodeRec("mac", 0, mlxQwen)}
	want := map[string]string{
		"alpha": "cannot run claude agents: claude is not on PATH",
		"beta":  "cannot run claude agents: it has none",
		"full":  "is full (4 of 4 agents)",
		"lab":   "lacks label pool=x",
		"mac":   "cannot run claude agents: it has none",
	}
	_, err := place(nodes, schemas.OpenRequest{Model: "sonnet", Labels: map[string]string{"pool": "x"}})
	if schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Fatalf("nothing fits: %v (code %q)", err, schemas.CodeOf(err))
	}
	list, ok := strings.CutPrefix(err.Error(), "no node can take this agent (")
	if !ok || !strings.HasSuffix(list, ")") {
		t.Fatalf("nothing fits: %q", err)
	}
	got := map[string]string{}
	for _, part := range strings.Split(strings.TrimSuffix(list, ")"), "; ") {
		name, why, _ := strings.Cut(part, ": ")
		if _, dup := got[name]; dup {
			t.Errorf("%s is listed twice in %q", name, err)
		}
		got[name] = why
	}
	if len(got) != len(nodes) {
		t.Errorf("%d nodes listed, want %d: %q", len(got), len(nodes), err)
	}
	for name, why := range want {
		if got[name] != why {
			t.Errorf("%s: listed as %q, want %q (in %q)", name, got[name], why, err)
		}
	}

	refused(t, nil, schemas.OpenRequest{}, schemas.CodeUnavailable, "no node is running: start one with `shoal up` or `shoal node`")
	refused(t, []schemas.NodeRecord{}, schemas.OpenRequest{Model: "ollama:qwen3:8b"}, schemas.CodeUnavailable, "no node is running")
}

// A sandboxed open goes only to a node that can sandbox, however busy; an
// open that declines the sandbox never goes to a node that requires it.
// A refusal says what the node lacks.
func TestPlaceSandbox(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	plain := nodeRec("plain", 0, claudeReady)
	plain.SandboxProblem = "Landlock is not enabled in this kernel"
	confining := nodeRec("confining", 7, claudeReady)
	confining.Sandbox, confining.SandboxMode = "landlock ABI 7", schemas.SandboxOff
	strict := nodeRec("strict", 0, claudeReady)
	strict.Sandbox, strict.SandboxMode = "landlock ABI 7", schemas.SandboxRequired
	pool := []schemas.NodeRecord{plain, confining, strict}
	placed(t, pool[:2], schemas.OpenRequest{Sandbox: &yes}, "confining")
	placed(t, pool[:2], schemas.OpenRequest{}, "plain")
	placed(t, []schemas.NodeRecord{strict, confining}, schemas.OpenRequest{Sandbox: &no}, "confining")
	placed(t, []schemas.NodeRecord{strict}, schemas.OpenRequest{}, "strict") // runs it sandboxed
	refused(t, pool, schemas.OpenRequest{Sandbox: &yes, Node: "plain"}, schemas.CodeUnavailable,
		"node plain cannot take this agent: cannot sandbox agents: Landlock is not enabled in this kernel")
	refused(t, []schemas.NodeRecord{plain, strict}, schemas.OpenRequest{Sandbox: &yes, Model: "acp:gemini"}, schemas.CodeUnavailable,
		"plain: cannot run acp:gemini agents", "strict: cannot run acp:gemini agents")
	refused(t, []schemas.NodeRecord{strict}, schemas.OpenRequest{Sandbox: &no}, schemas.CodeUnavailable,
		"strict: runs every agent sandboxed")
	// A sandbox at least as strong as asked: namespaces where a node gives
	// them, Landlock alone anywhere that sandboxes.
	spaced := nodeRec("spaced", 9, claudeReady)
	spaced.Sandbox, spaced.SandboxMode = "namespaces, landlock ABI 7", schemas.SandboxOff
	confining.SandboxProblem = "new user, mount, pid and network namespaces cannot be made"
	placed(t, []schemas.NodeRecord{confining, spaced}, schemas.OpenRequest{SandboxKind: schemas.SandboxNamespaces}, "spaced")
	placed(t, []schemas.NodeRecord{plain, confining}, schemas.OpenRequest{SandboxKind: schemas.SandboxLandlock}, "confining")
	refused(t, []schemas.NodeRecord{plain, confining}, schemas.OpenRequest{SandboxKind: schemas.SandboxNamespaces}, schemas.CodeUnavailable,
		"confining: cannot put agents in namespaces of their own: new user, mount, pid and network namespaces cannot be made", "plain: cannot sandbox agents")
}

// An open on a repository goes only to nodes with git, and says so when
// none has it or the node it names lacks it.
func TestGitNodes(t *testing.T) {
	withGit := schemas.NodeRecord{Name: "a", Git: "2.39.5"}
	without := schemas.NodeRecord{Name: "b"}
	nodes := []schemas.NodeRecord{withGit, without}
	if err := gitNodes(&nodes, ""); err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Fatalf("kept %+v (%v), want node a alone", nodes, err)
	}
	nodes = []schemas.NodeRecord{withGit, without}
	if err := gitNodes(&nodes, "b"); err == nil || err.Error() != "node b has no git, so it cannot run an agent on a repository" {
		t.Fatalf("naming node b: %v", err)
	}
	nodes = []schemas.NodeRecord{without}
	if err := gitNodes(&nodes, ""); err == nil || !strings.Contains(err.Error(), "no node has git") || schemas.CodeOf(err) != schemas.CodeUnavailable {
		t.Fatalf("no node with git: %v", err)
	}
}
