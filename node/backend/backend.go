package backend

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// Backend starts agent sessions of one kind.
type Backend interface {
	// Kind names the backend: "claude", "acp", "ollama", "vmlx".
	Kind() string
	// Start launches a session. It returns once the agent is ready for a
	// turn, or with an error that names what failed (never the
	// environment). Events flow to sink from then on.
	Start(ctx context.Context, spec Spec, sink Sink) (Session, error)
}

// Session is one live agent.
type Session interface {
	// Send writes a user turn and returns its number, counted from 1. The
	// backend emits turn_started when the turn actually begins, which for
	// a backend that queues prompts may be after the running turn's result.
	Send(ctx context.Context, text string) (turn int, err error)
	// Interrupt cancels the running turn, reporting whether a cancel was
	// delivered; false when no turn is running.
	Interrupt(ctx context.Context) (bool, error)
	// Close stops the agent and everything it started. It is idempotent,
	// and once it returns the session has emitted status dead.
	Close(ctx context.Context) error
	// Info describes the session.
	Info() Info
}

// ModelSetter is implemented by sessions that can switch models while
// keeping their conversation.
type ModelSetter interface {
	// SetModel switches to model, given as the caller gave it, and returns
	// the full model string the agent now runs (with its backend's prefix,
	// as Route reads it), or an error saying why it did not switch.
	SetModel(ctx context.Context, model string) (string, error)
}

// Info describes a running session.
type Info struct {
	PID           int    // the agent process, 0 when there is none
	SessionID     string // the vendor's conversation id, "" until known
	Transcript    string // the vendor's own transcript file, "" when none
	QueuesPrompts bool   // a turn sent during another is queued, not destructive
}

// Sink receives a session's events in the order the backend produced them.
// Emit never blocks for long and is safe for concurrent use.
type Sink interface {
	Emit(schemas.Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(schemas.Event)

// Emit calls f.
func (f SinkFunc) Emit(ev schemas.Event) { f(ev) }

// Spec is what a backend needs to start one agent.
type Spec struct {
	AgentID string
	CWD     string // absolute, an existing directory
	// Model is the caller's model string with the routing prefix removed
	// (Route); the backend interprets the rest.
	Model  string
	Effort string
	Policy schemas.Policy
	// MCPConfig is a caller-supplied MCP config file (claude agents).
	MCPConfig    string
	SystemPrompt string
	// MCP is the coordinator's MCP endpoint, where the agent reaches
	// Shoal's tools; its URL is empty when unknown.
	MCP MCPEndpoint
	// Dir is the node's directory for this agent's generated files.
	Dir string
	// Env is added to the backend's own environment for this agent.
	Env []string
	// Stderr receives the agent process's standard error.
	Stderr io.Writer
	Logger *slog.Logger
}

// MCPEndpoint is where agents reach the coordinator's MCP server.
type MCPEndpoint struct {
	URL   string // e.g. http://127.0.0.1:7777/mcp; "" when unknown
	Token string // bearer token, when the endpoint needs one
}

// Backend kinds, as Route returns them.
const (
	KindClaude = "claude"
	KindACP    = "acp"
	KindOllama = "ollama"
	KindVMLX   = "vmlx"
)

// Route picks the backend for a model string, Kaimon's way (first match
// wins): acp:<agent>[:<model>], vmlx:<tag>, ollama:<tag>, anything else
// is the claude CLI. It returns the kind and the model with its prefix
// removed.
func Route(model string) (kind, rest string) {
	for _, k := range []string{KindACP, KindVMLX, KindOllama} {
		if r, ok := strings.CutPrefix(model, k+":"); ok {
			return k, r
		}
	}
	return KindClaude, model
}

// Describer is implemented by backends that can say what they run here:
// the CLI's path and version, the models a server offers.
type Describer interface {
	Describe(ctx context.Context) schemas.BackendInfo
}

// ManyDescriber is implemented by backends that run several agents (the
// ACP backend: opencode, claude-agent-acp, gemini): a description of each
// one this machine has.
type ManyDescriber interface {
	DescribeAll(ctx context.Context) []schemas.BackendInfo
}
