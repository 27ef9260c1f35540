package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
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
}

// MCP serves Kaimon's nine agent tools, plus agent_nodes, over the
// fabric. A call that comes from an agent (its MCP config carries the
// agent's id) passes the door first: it is judged by that agent's policy.
type MCP struct {
	f   client.Client
	srv *server.MCPServer
	log *slog.Logger
}

// NewMCP builds the MCP server.
func NewMCP(cfg MCPConfig) *MCP {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0"
	}
	m := &MCP{f: cfg.Client, log: cfg.Logger.With("component", "mcp")}
	m.srv = server.NewMCPServer("shoal", cfg.Version,
		server.WithToolCapabilities(false),
		server.WithRecovery(),
		server.WithToolFilter(m.visible),
		server.WithInstructions("Shoal runs headless AI coding agents on a pool of machines. "+
			"Open one with agent_open in a directory, send it turns with agent_send (or agent_run to wait), "+
			"read its output with agent_output, and close it with agent_close. Events stream on NATS agent.<id> "+
			"and on the Kaimon bus as agent:<id>."))
	for _, t := range m.tools() {
		m.srv.AddTool(t.mcpTool(), m.handler(t))
	}
	return m
}

// Server is the underlying MCP server.
func (m *MCP) Server() *server.MCPServer { return m.srv }

// param is one argument of a tool.
type param struct {
	name     string
	kind     string // "string", "number", "integer", "boolean", "string[]", "map"
	required bool
	desc     string
	enum     []string
}

// tool is one MCP tool: its arguments and what it does with them.
type tool struct {
	name   string
	desc   string
	failed string // how a failure reads: "Error <failed>: <message>"
	params []param
	run    func(ctx context.Context, a args) (any, error)
}

func (t tool) mcpTool() mcp.Tool {
	opts := []mcp.ToolOption{mcp.WithDescription(t.desc)}
	for _, p := range t.params {
		po := []mcp.PropertyOption{mcp.Description(p.desc)}
		if p.required {
			po = append(po, mcp.Required())
		}
		switch p.kind {
		case "string":
			if p.enum != nil {
				po = append(po, mcp.Enum(p.enum...))
			}
			opts = append(opts, mcp.WithString(p.name, po...))
		case "number":
			opts = append(opts, mcp.WithNumber(p.name, po...))
		case "integer":
			opts = append(opts, mcp.WithNumber(p.name, append(po, func(s map[string]any) { s["type"] = "integer" })...))
		case "boolean":
			opts = append(opts, mcp.WithBoolean(p.name, po...))
		case "string[]":
			opts = append(opts, mcp.WithArray(p.name, append(po, mcp.WithStringItems())...))
		case "map":
			opts = append(opts, mcp.WithObject(p.name, append(po, mcp.AdditionalProperties(map[string]any{"type": "string"}))...))
		}
	}
	return mcp.NewTool(t.name, opts...)
}

// args are a call's validated arguments.
type args map[string]any

func (a args) str(k string) string {
	s, _ := a[k].(string)
	return s
}

func (a args) has(k string) bool { _, ok := a[k]; return ok }

func (a args) num(k string) float64 {
	f, _ := a[k].(float64)
	return f
}

func (a args) boolean(k string) bool {
	b, _ := a[k].(bool)
	return b
}

func (a args) strings(k string) []string {
	raw, _ := a[k].([]any)
	out := make([]string, 0, len(raw))
	for _, x := range raw {
		out = append(out, x.(string))
	}
	return out
}

// validate checks a call's arguments the way Kaimon words it, plus their
// types, which Kaimon left unchecked.
func (t tool) validate(raw map[string]any) (args, string) {
	known := map[string]param{}
	var names []string
	for _, p := range t.params {
		known[p.name] = p
		names = append(names, p.name)
	}
	sort.Strings(names)
	var unknown, missing, wrong []string
	for k := range raw {
		if _, ok := known[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	for _, p := range t.params {
		v, ok := raw[p.name]
		switch {
		case !ok || v == nil:
			if p.required {
				missing = append(missing, p.name)
			}
			delete(raw, p.name)
		case !typeOK(p.kind, v):
			wrong = append(wrong, fmt.Sprintf("%s must be %s, not %s", p.name, kindName(p.kind), jsonType(v)))
		case p.enum != nil && !slices.Contains(p.enum, v.(string)):
			wrong = append(wrong, fmt.Sprintf("%s must be one of %s, not %q", p.name, strings.Join(p.enum, ", "), v))
		}
	}
	sort.Strings(unknown)
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("Unknown parameter(s): %s. Valid parameters are: %s", strings.Join(unknown, ", "), strings.Join(names, ", ")))
	}
	if len(missing) > 0 {
		msgs = append(msgs, "Missing required parameter(s): "+strings.Join(missing, ", "))
	}
	if len(wrong) > 0 {
		msgs = append(msgs, "Invalid parameter(s): "+strings.Join(wrong, "; "))
	}
	return args(raw), strings.Join(msgs, ". ")
}

func typeOK(kind string, v any) bool {
	switch kind {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == float64(int64(f))
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string[]":
		xs, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range xs {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	case "map":
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, x := range m {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	}
	return false
}

func kindName(kind string) string {
	switch kind {
	case "string[]":
		return "an array of strings"
	case "map":
		return "an object of strings"
	case "integer":
		return "an integer"
	}
	return "a " + kind
}

func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "a string"
	case float64:
		if x == float64(int64(x)) {
			return "the number " + fmt.Sprint(int64(x))
		}
		return "the number " + fmt.Sprint(x)
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "null"
}

// handler adapts a tool: door, validation, the call, and the JSON text
// Kaimon returns. A mistake is a result the caller can read, flagged as an
// error.
func (m *MCP) handler(t tool) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		raw := map[string]any{}
		if req.Params.Arguments != nil {
			if b, err := json.Marshal(req.Params.Arguments); err == nil {
				json.Unmarshal(b, &raw)
			}
		}
		a, problem := t.validate(raw)
		if problem != "" {
			return mcp.NewToolResultError(problem), nil
		}
		if refused := m.door(ctx, t.name, a); refused != "" {
			m.log.Info("MCP call refused", "tool", t.name, "agent", callingAgent(ctx), "observer", observing(ctx), "why", refused)
			return mcp.NewToolResultError(refused), nil
		}
		out, err := t.run(ctx, a)
		if err != nil {
			if t.failed == "" {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultError("Error " + t.failed + ": " + err.Error()), nil
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, err
		}
		return mcp.NewToolResultText(string(b)), nil
	}
}

type agentKey struct{}

type observerKey struct{}

// observerTools are the tools that only read: all an observer's token may
// call.
var observerTools = []string{"agent_output", "agent_status", "agent_list", "agent_nodes", "agent_events"}

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
func (m *MCP) door(ctx context.Context, name string, a args) string {
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
	for _, k := range []string{"cwd", "mcp_config"} {
		if p := a.str(k); p != "" && !within(rec.Policy.CWD, p) {
			return refused(fmt.Sprintf("path is outside this agent's workspace: %s", p))
		}
	}
	return ""
}

// within reports whether path lies inside root, component-wise.
func within(root, path string) bool {
	if root == "" {
		return false
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(path))
	return err == nil && filepath.IsAbs(path) && rel != ".." && !strings.HasPrefix(rel, "../")
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
