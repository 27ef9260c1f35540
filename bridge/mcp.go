package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
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
	m := &MCP{f: cfg.Client, log: cfg.Logger.With("component", "mcp"), maxDepth: cfg.MaxDepth, metrics: cfg.Metrics}
	m.srv = server.NewMCPServer("shoal", cfg.Version,
		server.WithToolCapabilities(false),
		server.WithRecovery(),
		server.WithToolFilter(m.visible),
		server.WithInstructions("Shoal runs headless AI coding agents on a pool of machines. "+
			"Open one with agent_open in a directory, send it turns with agent_send (or agent_run to wait), "+
			"read its output with agent_output, and close it with agent_close. Events stream on NATS agent.<id> "+
			"and on the Kaimon bus as agent:<id>."))
	for _, t := range m.tools() {
		in, err := loadSchema(t.schema)
		if err != nil {
			panic(fmt.Sprintf("tool %s: %v", t.name, err)) // the embedded schemas are part of the binary
		}
		m.srv.AddTool(t.mcpTool(in), m.handler(t, in))
	}
	return m
}

// handler adapts a tool: validation against its schema, the door, the
// call, and the JSON text Kaimon returns. A mistake is a result the
// caller can read, flagged as an error.
func (m *MCP) handler(t tool, in inputSchema) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		raw := map[string]any{}
		if req.Params.Arguments != nil {
			if b, err := json.Marshal(req.Params.Arguments); err == nil {
				json.Unmarshal(b, &raw)
			}
		}
		if problem := in.validate(raw); problem != "" {
			m.metrics.ToolCalled(t.name, OutcomeInvalid)
			return mcp.NewToolResultError(problem), nil
		}
		if refused := m.door(ctx, t.name, raw); refused != "" {
			m.log.Info("MCP call refused", "tool", t.name, "agent", callingAgent(ctx), "observer", observing(ctx), "why", refused)
			m.metrics.ToolCalled(t.name, OutcomeRefused)
			return mcp.NewToolResultError(refused), nil
		}
		args, _ := json.Marshal(raw)
		out, err := t.run(ctx, args)
		if err != nil {
			m.metrics.ToolCalled(t.name, OutcomeError)
			if t.failed == "" {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultError("Error " + t.failed + ": " + err.Error()), nil
		}
		b, err := json.Marshal(out)
		if err != nil {
			m.metrics.ToolCalled(t.name, OutcomeError)
			return nil, err
		}
		m.metrics.ToolCalled(t.name, OutcomeOK)
		return mcp.NewToolResultText(string(b)), nil
	}
}

// mcpTool is the tool as tools/list shows it: its embedded schema and its
// hints.
func (t tool) mcpTool(in inputSchema) mcp.Tool {
	mt := mcp.NewToolWithRawSchema(t.name, t.desc, in.raw)
	hint := func(b bool) *bool { return &b }
	mt.Annotations = mcp.ToolAnnotation{
		ReadOnlyHint:    hint(t.readOnly),
		DestructiveHint: hint(t.destructive),
		IdempotentHint:  hint(t.readOnly || t.idempotent),
		OpenWorldHint:   hint(false),
	}
	return mt
}

type agentKey struct{}

type observerKey struct{}

// observerTools are the tools that only read: all an observer's token may
// call.
var observerTools = []string{"agent_output", "agent_status", "agent_list", "agent_nodes", "agent_events", "agent_pending"}

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

// door judges a call made by an agent against its policy, and confines
// the paths it passes to its own working directory. It returns why the
// call is refused, or "".
func (m *MCP) door(ctx context.Context, name string, a map[string]any) string {
	refused := func(why string) string { return name + " refused: " + why }
	if observing(ctx) && !slices.Contains(observerTools, name) {
		return refused("this token may only observe (" + strings.Join(observerTools, ", ") + ")")
	}
	id := callingAgent(ctx)
	if id == "" {
		return ""
	}
	rec, err := m.f.Record(ctx, id)
	if err != nil {
		return refused("the calling agent " + id + " is unknown")
	}
	if rec.Policy == nil {
		return refused("agent " + id + " has no recorded policy")
	}
	if ok, why := rec.Policy.DecideTool(name); !ok {
		return refused(why)
	}
	// Paths are confined as the kernel will follow them: symlinks resolved,
	// the resolved path passed on, so a link swapped afterwards changes
	// nothing.
	root, err := filepath.EvalSymlinks(rec.Policy.CWD)
	if err != nil {
		root = filepath.Clean(rec.Policy.CWD)
	}
	for _, k := range []string{"cwd", "mcp_config"} {
		p, _ := a[k].(string)
		if p == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil || !filepath.IsAbs(p) {
			return refused(fmt.Sprintf("path %s cannot be resolved inside this agent's workspace", p))
		}
		if !schemas.Within(root, real) {
			return refused(fmt.Sprintf("path is outside this agent's workspace: %s", p))
		}
		a[k] = real
	}
	if name == "agent_open" {
		return m.nested(rec, a, refused)
	}
	// An agent answers no request of its own or of its parent's: a person
	// (or an agent above them) does.
	if target, _ := a["agent_id"].(string); name == "agent_permit" && (target == id || target == rec.Parent) {
		who := "its own"
		if target != id {
			who = "its parent's"
		}
		return refused(fmt.Sprintf("agent %s may not answer %s permission requests", id, who))
	}
	// A sandboxed agent acts only on sandboxed agents: driving one that
	// is not would run its tools outside the sandbox.
	if target, _ := a["agent_id"].(string); rec.Sandbox != nil && target != "" && target != id && drives(name) {
		t, err := m.f.Record(ctx, target)
		if err == nil && t.Sandbox == nil {
			return refused(fmt.Sprintf("agent %s runs sandboxed, and agent %s does not", id, target))
		}
	}
	return ""
}

// drives reports whether a tool acts on an agent rather than reading it.
func drives(tool string) bool {
	switch tool {
	case "agent_send", "agent_run", "agent_interrupt", "agent_close", "agent_set_model", "agent_permit":
		return true
	}
	return false
}

// nested holds an agent's agent_open to its own rights: the child's
// policy no wider than its parent's, its depth within the coordinator's
// bound; the child's record names its parent and depth.
func (m *MCP) nested(parent schemas.AgentRecord, a map[string]any, refused func(string) string) string {
	var req schemas.OpenRequest
	b, _ := json.Marshal(a)
	if err := json.Unmarshal(b, &req); err != nil {
		return refused(err.Error())
	}
	depth := parent.Depth + 1
	if depth > m.maxDepth {
		return refused(fmt.Sprintf("agent %s is at depth %d, and agents may open agents only %d deep", parent.ID, parent.Depth, m.maxDepth))
	}
	child, err := schemas.ComposePolicy(req.Permission, req.PermissionMode, req.AllowedTools, req.DisallowedTools, req.Only)
	if err != nil {
		return refused(err.Error())
	}
	if err := parent.Policy.Admits(child, req.CWD); err != nil {
		return refused("a child may not exceed its parent: " + err.Error())
	}
	// A sandboxed agent's children are sandboxed, reaching no host their
	// parent may not.
	if sb := parent.Sandbox; sb != nil {
		if req.Sandbox != nil && !*req.Sandbox {
			return refused("a child may not exceed its parent: agent " + parent.ID + " runs sandboxed, so its children do too")
		}
		for _, h := range req.SandboxNet {
			if !netAllows(sb.Net, h) {
				return refused(fmt.Sprintf("a child may not exceed its parent: agent %s may not reach %s", parent.ID, h))
			}
		}
		a["sandbox"] = true
	}
	a["parent"], a["depth"] = parent.ID, depth
	return ""
}

// netAllows reports whether a sandbox's host list lets host (host or
// host:port) through, as its proxy would.
func netAllows(list []string, host string) bool {
	host = strings.ToLower(strings.TrimSpace(host))
	h, port, err := net.SplitHostPort(host)
	return slices.ContainsFunc(list, func(e string) bool {
		e = strings.ToLower(e)
		if err != nil { // a bare host: the web's ports
			return e == host || e == host+":443" && slices.Contains(list, host+":80")
		}
		return e == host || (e == h && (port == "443" || port == "80"))
	})
}

// visible hides from an agent the tools its policy does not let it call,
// when it runs under only or the specialist preset. A call of a single
// tool passes through, so a refused call gets the door's explanation.
func (m *MCP) visible(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	if observing(ctx) && len(tools) > 1 {
		tools = slices.DeleteFunc(slices.Clone(tools), func(t mcp.Tool) bool { return !slices.Contains(observerTools, t.Name) })
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
