package schemas

import "encoding/json"

// NodeRecord is a node as it advertises itself: the value of its key in
// NodesBucket, rewritten on every heartbeat, gone when the node is.
type NodeRecord struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Instance changes every time the node starts.
	Instance string            `json:"instance"`
	Labels   map[string]string `json:"labels"`
	// Backends are the kinds of agent the node can run or has detected.
	Backends []BackendInfo `json:"backends"`
	Host     HostInfo      `json:"host"`
	// Agents is how many live agents the node runs; MaxAgents its limit
	// (0: none).
	Agents    int     `json:"agents"`
	MaxAgents int     `json:"max_agents"`
	StartedAt float64 `json:"started_at"`
	Heartbeat float64 `json:"heartbeat"`
	// Relayed says the coordinator's relay wrote this record for a node
	// confined to it (the relay sets it, whatever the node sent): the
	// node's heartbeats depend on the relay.
	Relayed bool `json:"relayed,omitempty"`
	// Sandbox is the kernel sandbox the node can put agents in
	// ("namespaces, landlock ABI 7", or "landlock ABI 7" where the machine
	// gives no namespaces), empty when it cannot; SandboxProblem says why it
	// cannot, or why it gives no namespaces; SandboxMode is its --sandbox
	// mode.
	Sandbox        string `json:"sandbox,omitempty"`
	SandboxProblem string `json:"sandbox_problem,omitempty"`
	SandboxMode    string `json:"sandbox_mode,omitempty"`
	// SandboxHolds says the node holds a sandboxed agent's child beneath
	// its family's first directory (OpenRequest.Beneath); a node of an
	// earlier version does not, and the door keeps such children in
	// their parent's own directory there.
	SandboxHolds bool `json:"sandbox_holds,omitempty"`
	// Unhealthy says why the node cannot start agents now (its reaper
	// died and another is starting); placement passes it over. Empty when
	// it can.
	Unhealthy string `json:"unhealthy,omitempty"`
	// Git is the version of the git the node runs agents on repositories
	// with; empty when it has none, and placement then passes it over for
	// an open on a repository.
	Git string `json:"git,omitempty"`
	// Checkouts is the directory under which the node makes each agent
	// on a repository its checkout (<checkouts>/<id>).
	Checkouts string `json:"checkouts,omitempty"`
}

// BackendInfo is one kind of agent a node can run, or has found the means
// for.
type BackendInfo struct {
	// Kind is the backend: claude, acp, ollama, vmlx.
	Kind string `json:"kind"`
	// Agent names the ACP agent (opencode, claude, gemini).
	Agent   string `json:"agent,omitempty"`
	Path    string `json:"path,omitempty"`
	Version string `json:"version,omitempty"`
	// Host is the model server (Ollama, MLX) the backend talks to.
	Host string `json:"host,omitempty"`
	// Models are the model tags the server offers.
	Models []string `json:"models,omitempty"`
	// Ready says whether the node can run agents of this kind now;
	// Problem says why not.
	Ready   bool   `json:"ready"`
	Problem string `json:"problem,omitempty"`
}

// HostInfo describes a node's machine.
type HostInfo struct {
	Hostname     string   `json:"hostname"`
	OS           string   `json:"os"`
	Arch         string   `json:"arch"`
	CPUs         int      `json:"cpus"`
	MemoryBytes  uint64   `json:"memory_bytes"`
	GPUs         []string `json:"gpus"`
	AppleSilicon bool     `json:"apple_silicon"`
}

// MaxNodeRecordBytes is the most a node record holds, encoded. Every list
// of the nodes (shoal nodes, agent_nodes, the dashboard, placement) holds
// each record whole, so one node's may not crowd out the rest: the relay
// refuses a larger heartbeat, NodesBucket a larger value, and a node keeps
// its own within it (what a backend's model server lists is what grows:
// MaxModelBytes).
const MaxNodeRecordBytes = 64 << 10

// MaxModelBytes bounds the model names one backend of a node advertises,
// together (about 300 of usual length); a server listing more is
// advertised by its first within the bound.
const MaxModelBytes = 8 << 10

// Within is b as a node advertises it: its models within MaxModelBytes
// encoded (the first that fit, in the server's order; names longer than
// MaxLabelBytes are left out) and its strings within 1 KiB each. It
// returns how many models were left out.
func (b BackendInfo) Within() (BackendInfo, int) {
	models, size := make([]string, 0, len(b.Models)), 0
	for _, m := range b.Models {
		q, _ := json.Marshal(m) // as the record holds it: escapes take more
		if len(m) > MaxLabelBytes || size+len(q)+1 > MaxModelBytes {
			continue
		}
		size += len(q) + 1 // and its comma
		models = append(models, m)
	}
	left := len(b.Models) - len(models)
	if b.Models != nil {
		b.Models = models
	}
	b.Agent, b.Path, b.Version = cut(b.Agent, 1<<10), cut(b.Path, 1<<10), cut(b.Version, 1<<10)
	b.Host, b.Problem = cut(b.Host, 1<<10), cut(b.Problem, 1<<10)
	return b, left
}

// MaxNodeLabels and MaxLabelBytes bound a node's labels: each is a row's
// key in the coordinator's count of spend (Spent), which is one value of
// BudgetsBucket, so a node's labels are few and short.
const (
	MaxNodeLabels = 16
	MaxLabelBytes = 128
)

// ValidNodeLabels checks a node's labels: at most MaxNodeLabels, each at
// most MaxLabelBytes as key=value, the key not empty (code invalid).
func ValidNodeLabels(labels map[string]string) error {
	if len(labels) > MaxNodeLabels {
		return Errf(CodeInvalid, "a node carries at most %d labels, not %d", MaxNodeLabels, len(labels))
	}
	for _, l := range LabelsOf(labels) {
		if len(l) > MaxLabelBytes {
			return Errf(CodeInvalid, "label %.24q… is %d bytes long; a label (key=value) is at most %d", l, len(l), MaxLabelBytes)
		}
		if err := ValidLabel(l); err != nil {
			return err
		}
	}
	return nil
}
