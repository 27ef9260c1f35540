package backend

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"

	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// Backend starts agent sessions of one kind. A backend that holds
// resources of its own (a server) also implements io.Closer; the node
// closes it once its agents are gone.
type Backend interface {
	// Kind names the backend: "claude", "acp", "ollama", "vmlx".
	Kind() string
	// Start launches a session. It returns once the agent is ready for a
	// turn, or with an error that names what failed (never the
	// environment). Events flow to sink from then on.
	Start(ctx context.Context, spec Spec, sink Sink) (Session, error)
}

// Session is one live agent. The node owns its turns: it numbers them,
// holds a turn sent while another runs, and hands the session one turn at
// a time, only once the previous one's Result has been emitted. A session
// never numbers turns, never queues them and never emits TurnStarted; the
// node stamps every event it emits with the turn it belongs to.
type Session interface {
	// Prompt gives the agent turn n's text (n only names things, such as
	// tool call ids). It returns once the agent has it (the line written
	// to the CLI's stdin, the request sent), or with an error saying why it
	// could not be given, in which case the turn never began. From then on
	// the session's events belong to the turn, until it emits the turn's
	// Result.
	Prompt(ctx context.Context, n int, text string) error
	// Interrupt cancels the running turn, reporting whether a cancel was
	// delivered; false when no turn is running. An error says the cancel
	// could not be delivered (the agent stopped reading, say): the node
	// then stops the agent.
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
	PID        int    // the agent process, 0 when there is none
	SessionID  string // the vendor's conversation id, "" until known
	Transcript string // the vendor's own transcript file, "" when none
}

// Sink receives a session's events in the order the backend produced them.
// Emit never blocks for long and is safe for concurrent use. The Turn of
// an event a session emits is ignored: the node knows which turn runs.
type Sink interface {
	Emit(schemas.Event)
}

// Spender is a Sink that also hears what the running turn has used so
// far, before its result says it in all: the node holds a turn to its
// budgets with it, and interrupts one that crosses a budget. A backend
// that learns its usage during a turn (per model message, per round)
// tells it, the turn's total so far each time; none is an event, so no
// reader counts it twice. Found on the Sink by type assertion.
type Spender interface {
	Spending(turnSoFar schemas.Usage)
}

// Spending tells sink, if it hears it, what the running turn has used so
// far.
func Spending(sink Sink, turnSoFar schemas.Usage) {
	if s, ok := sink.(Spender); ok {
		s.Spending(turnSoFar)
	}
}

// Spec is what a backend needs to start one agent.
type Spec struct {
	AgentID string
	CWD     string // absolute, an existing directory
	// Beneath, when set, is a directory CWD lies inside, from which it is
	// opened through no symbolic link where the node acts on it (its
	// sandbox, its files served to the agent): see OpenRequest.Beneath.
	Beneath string
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
	// Reaper holds the agent's processes (ProcessSpec.Reaper); nil when
	// the node has none.
	Reaper *proc.Reaper
	// Sandbox confines every process of the agent (ProcessSpec.Sandbox);
	// nil when it runs unconfined. Env then points it at its proxy and its
	// temp directory.
	Sandbox *proc.Confinement
	// Asker puts the tool calls the agent asks permission for to a person
	// when its policy asks (Policy.Ask); nil refuses them.
	Asker  Asker
	Logger *slog.Logger
}

// Asker puts a tool call the agent asks permission for to a person and
// returns the answer: the node's, which records and publishes the
// request, and denies it at its deadline or when the agent ends. It
// blocks until then; a backend calls it off the goroutine that reads the
// agent.
type Asker interface {
	Ask(ctx context.Context, q Question) Verdict
}

// Question is a tool call put to a person.
type Question struct {
	Tool        string
	ToolCallID  string
	Input       json.RawMessage
	Description string
	// Options are the agent's own choices, when it offers them.
	Options []schemas.PermissionOption
}

// Verdict is a person's answer, or the node's in their stead.
type Verdict struct {
	Allow bool
	// Option is the agent's option chosen, if any.
	Option string
	// Message goes back to the agent with a denial.
	Message string
	// Input is the tool's input as the person allowed it, if changed.
	Input json.RawMessage
}

// MCPEndpoint is where agents reach the coordinator's MCP server.
type MCPEndpoint struct {
	URL string // e.g. http://127.0.0.1:7777/mcp; "" when unknown
	// Token is the bearer token the agent presents. A node is configured
	// with the endpoint's own token and hands each agent only its own
	// (schemas.AgentToken).
	Token string
}

// Backend kinds (schemas.Route names them).
const (
	BackendClaude = schemas.BackendClaude
	BackendACP    = schemas.BackendACP
	BackendOllama = schemas.BackendOllama
	BackendVMLX   = schemas.BackendVMLX
)

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

// Checker is implemented by backends that can tell a spec they would
// refuse before anything is started or claimed for it (an unknown
// effort, an mcp_config that is no MCP configuration): the node asks
// first, so a refused open leaves nothing behind.
type Checker interface {
	Check(spec Spec) error
}

// UnreachableError says an agent could not start because a server it
// needs from its start (an MCP server its tools come from) could not be
// started, reached or initialized, or refused it: the node cannot start
// the agent now, whatever the request said. The node answers it as
// unavailable, not as a wrong request.
type UnreachableError struct{ Err error }

func (e *UnreachableError) Error() string { return e.Err.Error() }

func (e *UnreachableError) Unwrap() error { return e.Err }
