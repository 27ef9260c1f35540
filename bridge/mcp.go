package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/schemas/validate"
)

// MCPConfig configures the MCP tools.
type MCPConfig struct {
	Client  client.Client
	Version string
	Logger  *slog.Logger
	// MaxDepth bounds how deep agents may open agents (an agent's child
	// is at depth 1); schemas.DefaultMaxDepth when zero, none when
	// negative.
	MaxDepth int
	// Metrics counts tool calls; nil counts nothing.
	Metrics MCPMetrics
}

// MCPMetrics receives what the MCP tools count. Its methods are called
// from many goroutines and must not block.
type MCPMetrics interface {
	// ToolCalled counts a tool call by its outcome: OutcomeOK,
	// OutcomeInvalid, OutcomeRefused or OutcomeError.
	ToolCalled(tool, outcome string)
}

// The outcomes of a tool call.
const (
	OutcomeOK      = "ok"      // the tool answered
	OutcomeInvalid = "invalid" // the arguments do not fit the tool's schema
	OutcomeRefused = "refused" // the door refused the caller (an agent's policy, an observer's token)
	OutcomeError   = "error"   // the operation failed (an unknown agent, a node away, a timeout)
)

type noMCPMetrics struct{}

func (noMCPMetrics) ToolCalled(string, string) {}

// MCP serves Kaimon's nine agent tools, plus agent_nodes and
// agent_events, over the fabric. A call that comes from an agent (its MCP
// config carries the agent's id) passes the door first: it is judged by
// that agent's policy.
type MCP struct {
	f        client.Client
	srv      *server.MCPServer
	log      *slog.Logger
	maxDepth int
	metrics  MCPMetrics
	calls    *calls
}

// NewMCP builds the MCP server.
func NewMCP(cfg MCPConfig) *MCP {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0"
	}
	switch {
	case cfg.MaxDepth == 0:
		cfg.MaxDepth = schemas.DefaultMaxDepth
	case cfg.MaxDepth < 0:
		cfg.MaxDepth = 0
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMCPMetrics{}
	}
	m := &MCP{f: cfg.Client, log: cfg.Logger.With("component", "mcp"), maxDepth: cfg.MaxDepth, metrics: cfg.Metrics, calls: newCalls()}
	m.srv = server.NewMCPServer("shoal", cfg.Version,
		server.WithToolCapabilities(false),
		// logging/setLevel is accepted and completion/complete answers
		// (with nothing: Shoal has no prompts or resource templates to
		// complete), as MCP clients that probe them expect.
		server.WithLogging(),
		server.WithCompletions(),
		server.WithRecovery(),
		server.WithToolFilter(m.visible),
		server.WithInstructions("Shoal runs headless AI coding agents on a pool of machines. "+
			"Open one with agent_open in a directory, send it turns with agent_send (or agent_run to wait), "+
			"read its output with agent_output, and close it with agent_close. Events stream on NATS agent.<id> "+
			"and on the Kaimon bus as agent:<id>."))
	for _, t := range m.tools() {
		in := validate.MustCaller(t.schema) // the embedded schemas are part of the binary
		m.srv.AddTool(t.mcpTool(in), m.handler(t, in))
	}
	return m
}

// handler adapts a tool: validation against the schema tools/list
// advertises, the caller's bound of reading calls under way (calls.go), the
// caller, the tool's run (which asks the door), and the JSON text Kaimon
// returns. A mistake is a result the caller can read,
// flagged as an error.
func (m *MCP) handler(t tool, in *validate.Request) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if args == nil {
			args = map[string]any{} // absent: no arguments
		}
		raw, err := json.Marshal(args)
		if err == nil {
			raw, err = in.Check(raw)
		}
		bodyRead(ctx)
		if err != nil {
			m.metrics.ToolCalled(t.name, OutcomeInvalid)
			return mcp.NewToolResultError(err.Error()), nil
		}
		if bounded(ctx, t.name) {
			end, err := m.calls.begin(callerOf(ctx))
			if err != nil {
				m.metrics.ToolCalled(t.name, OutcomeRefused)
				return mcp.NewToolResultError(t.name + " refused: " + err.Error()), nil
			}
			var release func()
			ctx, release = holdCall(ctx, end)
			defer release()
		}
		if meta := req.Params.Meta; meta != nil && meta.ProgressToken != nil {
			token := meta.ProgressToken
			ctx = context.WithValue(ctx, progressKey{}, func(progress float64, message string) {
				m.srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": token, "progress": progress, "message": message,
				})
			})
		}
		c, err := m.caller(ctx)
		if err == nil {
			var out any
			if out, err = t.run(ctx, c, raw); err == nil {
				b, err := json.Marshal(out)
				if err != nil {
					m.metrics.ToolCalled(t.name, OutcomeError)
					return nil, err
				}
				m.metrics.ToolCalled(t.name, OutcomeOK)
				return mcp.NewToolResultText(string(b)), nil
			}
		}
		if r, ok := errors.AsType[*refusal](err); ok {
			m.log.Info("MCP call refused", "tool", t.name, "caller", c.p.String(), "why", r.why)
			m.metrics.ToolCalled(t.name, OutcomeRefused)
			return mcp.NewToolResultError(t.name + " refused: " + r.why), nil
		}
		m.metrics.ToolCalled(t.name, OutcomeError)
		if t.failed == "" {
			return mcp.NewToolResultError(err.Error()), nil
		}
		return mcp.NewToolResultError("Error " + t.failed + ": " + err.Error()), nil
	}
}

// mcpTool is the tool as tools/list shows it: its schema and its hints.
func (t tool) mcpTool(in *validate.Request) mcp.Tool {
	mt := mcp.NewToolWithRawSchema(t.name, t.desc, in.Schema())
	hint := func(b bool) *bool { return &b }
	readOnly := slices.Contains(schemas.ReadOnlyTools(), t.name)
	mt.Annotations = mcp.ToolAnnotation{
		ReadOnlyHint:    hint(readOnly),
		DestructiveHint: hint(t.destructive),
		IdempotentHint:  hint(readOnly || t.idempotent),
		OpenWorldHint:   hint(false),
	}
	return mt
}

type agentKey struct{}

type observerKey struct{}

// withObserver marks ctx as a call made with an observer's token.
func withObserver(ctx context.Context) context.Context {
	return context.WithValue(ctx, observerKey{}, true)
}

func observing(ctx context.Context) bool {
	o, _ := ctx.Value(observerKey{}).(bool)
	return o
}

// WithCallingAgent marks ctx as carrying a call made by an agent.
func WithCallingAgent(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, agentKey{}, id)
}

func callingAgent(ctx context.Context) string {
	id, _ := ctx.Value(agentKey{}).(string)
	return id
}

// caller is who makes a tool call: a person of a role, or an agent with
// its record, read once per call.
type caller struct {
	p   schemas.Principal
	rec *schemas.AgentRecord // an agent's own
}

// refusal is a call the door refused; its why names the rule.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

func refused(format string, args ...any) error { return &refusal{why: fmt.Sprintf(format, args...)} }

// caller reads who makes the call: an agent by the identity its node's
// MCP config or its proxy gave the request, an observer by its token,
// anyone else a person with every right.
func (m *MCP) caller(ctx context.Context) (caller, error) {
	if id := callingAgent(ctx); id != "" {
		rec, err := m.f.Record(ctx, id)
		if err != nil {
			return caller{p: schemas.Principal{Kind: schemas.KindAgent, Agent: id}}, refused("the calling agent %s is unknown", id)
		}
		if rec.Policy == nil {
			return caller{p: schemas.AgentPrincipal(rec)}, refused("agent %s has no recorded policy", id)
		}
		return caller{p: schemas.AgentPrincipal(rec), rec: &rec}, nil
	}
	if observing(ctx) {
		return caller{p: schemas.Person(schemas.RoleObserver)}, nil
	}
	return caller{p: schemas.Person(schemas.RoleFull)}, nil
}

// door judges a call of tool name about agent target ("" for none): the
// rights rules for every caller, and for an agent its tool policy too.
func (m *MCP) door(ctx context.Context, c caller, name, target string) error {
	if c.rec != nil {
		if ok, why := c.rec.Policy.DecideTool(name); !ok {
			return refused("%s", why)
		}
	}
	if err := client.Authorize(ctx, m.f, c.p, c.rec, schemas.ToolAccess[name], target, toolVerb(name)); err != nil {
		if schemas.CodeOf(err) == schemas.CodeForbidden {
			return refused("%s", err.Error())
		}
		return err
	}
	return nil
}

// toolVerb is what a tool does, as a refusal says it.
func toolVerb(name string) string {
	switch name {
	case "agent_send":
		return "send to"
	case "agent_run":
		return "run a turn of"
	case "agent_set_model":
		return "set the model of"
	case "agent_permit":
		return "answer a permission request of"
	case "agent_open":
		return "open agents"
	case "agent_nodes":
		return "list the nodes"
	case "agent_list":
		return "list agents"
	case "agent_pending":
		return "list permission requests"
	case "agent_fetch":
		return "fetch the work of"
	case "agent_job":
		return "run jobs on a repository"
	}
	verb := strings.TrimPrefix(name, "agent_")
	switch schemas.ToolAccess[name] {
	case schemas.AccessRead:
		return "read the " + verb + " of"
	}
	return verb
}

// confine holds the paths an agent passes to its own working directory,
// as the kernel will follow them: symlinks resolved, the resolved path
// passed on, so a link swapped afterwards changes nothing. The paths are
// on the agent's node, whose filesystem this coordinator may not see: a
// path it cannot resolve here is held to the directory by its name
// alone, and the node that runs the child resolves it on its own
// (OpenRequest.Within, which every child's open carries).
//
// local says a path was not found here: it is on the agent's node alone,
// and so is the child (the same path on another node is another
// directory, which the parent never had).
func confine(rec *schemas.AgentRecord, paths ...*string) (local bool, err error) {
	root := parentRoot(*rec)
	for _, p := range paths {
		if *p == "" {
			continue
		}
		if !filepath.IsAbs(*p) {
			return false, refused("path %s is not absolute: name it inside this agent's workspace, %s", *p, rec.Policy.CWD)
		}
		real, err := filepath.EvalSymlinks(*p)
		if err != nil {
			// Not here: perhaps on the agent's node alone.
			if real = filepath.Clean(*p); !schemas.Within(filepath.Clean(rec.Policy.CWD), real) {
				return false, refused("path is outside this agent's workspace: %s", *p)
			}
			local = true
		} else if !schemas.Within(root, real) {
			return false, refused("path is outside this agent's workspace: %s", *p)
		}
		*p = real
	}
	return local, nil
}

// nested holds an agent's agent_open to its own rights: the child's
// policy, reach and sandbox no wider than its parent's, its depth within
// the coordinator's bound; the child's record names its parent and depth.
func (m *MCP) nested(parent schemas.AgentRecord, req *schemas.OpenRequest) error {
	depth := parent.Depth + 1
	if depth > m.maxDepth {
		return refused("agent %s is at depth %d, and agents may open agents only %d deep", parent.ID, parent.Depth, m.maxDepth)
	}
	child, err := schemas.ComposePolicy(req.Permission, req.PermissionMode, req.AllowedTools, req.DisallowedTools, req.Only)
	if err != nil {
		return refused("%s", err.Error())
	}
	if err := parent.Policy.Admits(child, req.CWD); err != nil {
		return refused("a child may not exceed its parent: %s", err.Error())
	}
	if req.Reach.Wider(parent.Reach) {
		return refused("a child may not exceed its parent: reach %s is wider than agent %s's (%s)", req.Reach, parent.ID, parent.Reach.String())
	}
	// A sandboxed agent's children are sandboxed, reaching no host their
	// parent's open did not let it reach: its record's sandbox_net, which
	// the coordinator's side claimed, not the sandbox's net, which its
	// node writes (with the model API and MCP endpoint its own node adds,
	// as a child's node adds its own).
	if sb := parent.Sandbox; sb != nil {
		if req.Sandbox != nil && !*req.Sandbox {
			return refused("a child may not exceed its parent: agent %s runs sandboxed, so its children do too", parent.ID)
		}
		for _, h := range req.SandboxNet {
			if !schemas.NetAllows(parent.SandboxNet, h) {
				return refused("a child may not exceed its parent: agent %s may not reach %s (its open's sandbox_net: %s)", parent.ID, h, strings.Join(parent.SandboxNet, ", "))
			}
		}
		// Its child takes no MCP config of its own: the parent writes its
		// directory and could swap the file for a link while the node
		// reads it. (The child's directory it could swap too: the node
		// opens it from the family's first directory through no link,
		// OpenRequest.Beneath, set by the door.)
		if req.MCPConfig != "" {
			return refused("agent %s runs sandboxed: its children take no mcp_config (a file it could swap for a link while its node reads it)", parent.ID)
		}
		yes := true
		req.Sandbox = &yes
		// In namespaces of its own, its children are too: a node that
		// gives Landlock alone holds them less (no root, /proc or network
		// of their own).
		if schemas.SandboxGives(sb.Kernel, schemas.SandboxNamespaces) {
			if req.SandboxKind == schemas.SandboxLandlock {
				return refused("a child may not exceed its parent: agent %s runs in namespaces of its own (%s), so its children do too", parent.ID, sb.Kernel)
			}
			req.SandboxKind = schemas.SandboxNamespaces
		}
	}
	req.Parent, req.Depth = parent.ID, depth
	return nil
}

// familyRoot is the directory of the first agent of a sandboxed agent's
// family: up its parents while they are sandboxed (a sandboxed agent's
// children always are). No agent of the family can rename it (each
// writes inside it, none its parent directory), so the node opens a
// child's directory from it: a parent that swaps the child's directory
// for a link gets its open refused, never a child outside.
//
// A parent whose record cannot be read ends the trace with a refusal: a
// sandboxed agent above it could rename what lies below.
func (m *MCP) familyRoot(ctx context.Context, rec schemas.AgentRecord) (string, error) {
	for range m.maxDepth + 1 {
		if rec.Parent == "" {
			break
		}
		up, err := m.f.Record(ctx, rec.Parent)
		if err != nil {
			return "", refused("agent %s's family cannot be traced (the record of its parent %s: %v): a sandboxed agent's children are held beneath its family's first directory", rec.ID, rec.Parent, err)
		}
		if up.Sandbox == nil {
			break
		}
		rec = up
	}
	if rec.Policy == nil || rec.Policy.CWD == "" {
		return "", refused("agent %s's family cannot be traced (its record names no directory): a sandboxed agent's children are held beneath its family's first directory", rec.ID)
	}
	return rec.Policy.CWD, nil
}

// holdsBeneath refuses a sandboxed agent's child in a subdirectory of its
// directory when the agent's node is of a version that ignores
// OpenRequest.Beneath (its record does not say sandbox_holds): there the
// child's directory would be taken by name again, which the parent can
// swap for a link. In the parent's own directory it may open one, as
// before.
func (m *MCP) holdsBeneath(ctx context.Context, parent schemas.AgentRecord, cwd string) error {
	if cwd == parentRoot(parent) || filepath.Clean(cwd) == filepath.Clean(parent.Policy.CWD) {
		return nil
	}
	nodes, err := m.f.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Name == parent.Node && n.SandboxHolds {
			return nil
		}
	}
	return refused("agent %s runs sandboxed on node %s, which does not hold a child's directory beneath its family's (a node of an earlier version): open the child in %s itself, or upgrade the node", parent.ID, parent.Node, parent.Policy.CWD)
}

// parentRoot is an agent's working directory as confine holds its
// children's paths to it.
func parentRoot(parent schemas.AgentRecord) string {
	if root, err := filepath.EvalSymlinks(parent.Policy.CWD); err == nil {
		return root
	}
	return filepath.Clean(parent.Policy.CWD)
}

// visible hides from an observer the tools it may not call, and from an
// agent that runs under only or the specialist preset the tools its
// policy does not let it call. A call of a single tool passes through, so
// a refused call gets the door's explanation.
func (m *MCP) visible(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	if observing(ctx) && len(tools) > 1 {
		reads := schemas.ReadOnlyTools()
		tools = slices.DeleteFunc(slices.Clone(tools), func(t mcp.Tool) bool { return !slices.Contains(reads, t.Name) })
	}
	id := callingAgent(ctx)
	if id == "" || len(tools) <= 1 {
		return tools
	}
	rec, err := m.f.Record(ctx, id)
	if err != nil || rec.Policy == nil || !(rec.Policy.Only || rec.Policy.Preset == schemas.PresetSpecialist) {
		return tools
	}
	var out []mcp.Tool
	for _, t := range tools {
		if ok, _ := rec.Policy.DecideTool(t.Name); ok {
			out = append(out, t)
		}
	}
	return out
}

// progressKey carries, for a call that asked for progress, how to report
// it (notifications/progress with the call's token).
type progressKey struct{}

// progressOf is how to report a call's progress, or nil.
func progressOf(ctx context.Context) func(progress float64, message string) {
	p, _ := ctx.Value(progressKey{}).(func(float64, string))
	return p
}
