package backend

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/shoalfabric/shoal/node/proc"
)

// Confiner is implemented by backends that can run their agents
// sandboxed: it names what an agent's processes need beyond its directory
// and its temp directory.
type Confiner interface {
	SandboxNeeds(spec Spec) (Needs, error)
}

// Needs is what a sandboxed agent's processes need besides its directory
// and its temp directory.
type Needs struct {
	// Writable are where the CLI keeps its own state (created when
	// missing, so the kernel can grant them).
	Writable []string
	// Readable are what it reads besides the system: its install, the
	// files the node wrote for it.
	Readable []string
	// Runs are those of Readable that the node runs or reads unconfined,
	// for this agent's next life or for other agents: the CLI's install,
	// the user's configuration the node reads. The agent may not work in
	// a directory holding one, where it could rewrite it.
	Runs []string
	// Hosts are the model API and anything else it must reach through the
	// agent's proxy (host or host:port).
	Hosts []string
	// Ports are loopback TCP ports it must reach directly (an endpoint of
	// the node's own).
	Ports []uint16
	// Bind are TCP ports it listens on (a server of its own, which it
	// also reaches).
	Bind []uint16
	// Env names the environment variables its CLI reads (a name, or a
	// prefix ending in "*": its model API's and its own settings). A
	// sandboxed agent gets these, the few every program needs and what
	// Shoal sets for it; the node's other variables stay behind.
	Env []string
}

// ClaudeNotSeeded are the files of the user's claude config directory a
// sandboxed agent's own (AgentHome) gets no copy of, for the claude CLI
// and claude-agent-acp alike: with CLAUDE_CONFIG_DIR set, the CLI keeps
// its .claude.json there (in HOME otherwise, where no agent's copy reads
// it), and it holds the user's MCP servers with their tokens and every
// project's; the CLI keeps backups of it beside it.
var ClaudeNotSeeded = []string{".claude.json", ".claude.json.*"}

// AgentHome is a directory of a sandboxed agent's own beside the node's
// files for it (its CLI's config or home), kept from life to life.
func AgentHome(spec Spec, cli string) string {
	return filepath.Join(spec.Dir, cli+"-"+spec.AgentID)
}

// maxMCPConfig is the largest MCP configuration a node reads.
const maxMCPConfig = 1 << 20

// ReadMCPConfig reads a caller's mcp_config: a regular file (a FIFO
// there does not hold the open up) of at most 1 MiB.
func ReadMCPConfig(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return proc.ReadRegular(f, maxMCPConfig)
}
