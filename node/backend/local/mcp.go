package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
)

// mcpServer is one MCP server an agent's tools come from.
type mcpServer struct {
	Name string // as in the config; the coordinator's is schemas.MCPServerName
	// Command, with Args and Env (KEY=VALUE added to the node's
	// environment), starts a stdio server in Dir ("" is the node's).
	Command string
	Args    []string
	Env     []string
	Dir     string
	// URL is a Streamable HTTP server, or with SSE an HTTP+SSE one (the
	// transport MCP deprecated in 2025-03-26); Headers go with every request.
	URL     string
	Headers map[string]string
	SSE     bool
}

// mcpConnectTimeout bounds connecting to the servers when the caller's
// context has no deadline.
const mcpConnectTimeout = 30 * time.Second

// parseMCPConfig reads Claude's MCP config format:
//
//	{"mcpServers": {"<name>": {"type"?: "stdio", "command", "args", "env": {}}
//	                 "<name>": {"type"?: "http"|"streamable-http"|"sse", "url", "headers": {}}}}
//
// Servers come back in the order the file gives them. A server whose shape
// is not one of these, or that has a key Shoal does not understand (such as
// headersHelper), is an error naming it. ${VAR} references are not
// expanded.
func parseMCPConfig(b []byte) ([]mcpServer, error) {
	var top struct {
		MCPServers json.RawMessage `json:"mcpServers"`
	}
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("reading the MCP config: %w", err)
	}
	if len(top.MCPServers) == 0 || string(top.MCPServers) == "null" {
		return nil, errors.New(`the MCP config has no "mcpServers" object`)
	}
	names, raws, err := orderedObject(top.MCPServers)
	if err != nil {
		return nil, fmt.Errorf(`reading the MCP config's "mcpServers": %w`, err)
	}
	servers := make([]mcpServer, 0, len(names))
	for i, name := range names {
		s, err := parseMCPServer(name, raws[i])
		if err != nil {
			return nil, fmt.Errorf("MCP server %q: %w", name, err)
		}
		servers = append(servers, s)
	}
	return servers, nil
}

// orderedObject splits a JSON object into its keys, in order, and values.
func orderedObject(b []byte) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, errors.New("not a JSON object")
	}
	var names []string
	var raws []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		name := t.(string) // an object's keys are strings
		if slices.Contains(names, name) {
			return nil, nil, fmt.Errorf("server %q is named twice", name)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("server %q: %w", name, err)
		}
		names, raws = append(names, name), append(raws, raw)
	}
	return names, raws, nil
}

func parseMCPServer(name string, raw json.RawMessage) (mcpServer, error) {
	var c struct {
		Type    string            `json:"type"`
		Command string            `json:"command"`
		Args    []string          `json:"args"`
		Env     map[string]string `json:"env"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
	}
	if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		return mcpServer{}, errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return mcpServer{}, err
	}
	s := mcpServer{Name: name, Command: c.Command, Args: c.Args, URL: c.URL, Headers: c.Headers}
	for _, k := range slices.Sorted(maps.Keys(c.Env)) {
		s.Env = append(s.Env, k+"="+c.Env[k])
	}
	kind := strings.ToLower(c.Type)
	if kind == "" {
		switch {
		case c.Command != "" && c.URL != "":
			return mcpServer{}, errors.New(`has both "command" and "url"`)
		case c.Command != "":
			kind = "stdio"
		case c.URL != "":
			kind = "http"
		default:
			return mcpServer{}, errors.New(`has neither "command" (stdio) nor "url" (http)`)
		}
	}
	switch kind {
	case "stdio":
		if c.URL != "" || c.Headers != nil {
			return mcpServer{}, errors.New(`is a stdio server but has "url" or "headers"`)
		}
		if c.Command == "" {
			return mcpServer{}, errors.New(`is a stdio server without a "command"`)
		}
	case "http", "streamable-http", "sse":
		if c.Command != "" || c.Args != nil || c.Env != nil {
			return mcpServer{}, fmt.Errorf(`has type %q, which takes a "url", but has "command", "args" or "env"`, kind)
		}
		s.SSE = kind == "sse"
	default:
		return mcpServer{}, fmt.Errorf(`has unknown type %q (want stdio, http, streamable-http or sse)`, c.Type)
	}
	if err := s.check(); err != nil {
		return mcpServer{}, err
	}
	return s, nil
}

// check reports what makes a server impossible to connect to.
func (s mcpServer) check() error {
	switch {
	case s.Name == "":
		return errors.New("an MCP server has no name")
	case strings.Contains(s.Name, "__"):
		// mcp__<server>__<tool> would not split back into its parts.
		return errors.New(`the name has "__" in it, so its tools' qualified names would be ambiguous`)
	case s.Command != "" && s.URL != "":
		return errors.New("has both a command and a URL")
	case s.Command == "" && s.URL == "":
		return errors.New("has neither a command nor a URL")
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
		}
	}
	if s.URL != "" {
		u, err := url.Parse(s.URL)
		if err != nil {
			return err
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("URL %q is not an http or https URL", s.URL)
		}
	}
	return nil
}

// mcpToolbox is the tools an agent's MCP servers offer it, filtered by its
// policy. It implements toolbox.
type mcpToolbox struct {
	conns   []*mcpConn
	offered []toolSpec
	// routes maps each offered name to where it goes.
	routes    map[string]mcpRoute
	closed    atomic.Bool
	closeOnce sync.Once
}

var _ toolbox = (*mcpToolbox)(nil)

type mcpRoute struct {
	conn *mcpConn
	tool string // the server's own name for it
}

// mcpConn is one initialized MCP session.
type mcpConn struct {
	name   string
	client *client.Client
	stop   context.CancelFunc // ends the transport's lifetime
	proc   *proc.Process      // a stdio server's process, held as the agent's are
	stderr *proc.Ring         // the end of a stdio server's standard error
}

// openToolbox connects to every server, lists its tools and keeps those
// pol allows (see mcpPermitted). The model is offered each tool by its bare
// name; when two servers offer the same one, the later server's is offered
// as <server>__<tool>. ctx bounds connecting (mcpConnectTimeout when it
// has no deadline); the sessions then last until close. A server that
// cannot be reached, initialized or listed is an error naming it, and
// then nothing stays open.
func openToolbox(ctx context.Context, servers []mcpServer, pol schemas.Policy, l launch) (*mcpToolbox, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mcpConnectTimeout)
		defer cancel()
	}
	conns := make([]*mcpConn, len(servers))
	lists := make([][]mcp.Tool, len(servers))
	errs := make([]error, len(servers))
	wrong := false // a server's configuration, not the server, is at fault
	var wg sync.WaitGroup
	for i, s := range servers {
		if err := s.check(); err != nil {
			errs[i], wrong = fmt.Errorf("MCP server %q: %w", s.Name, err), true
			continue
		}
		if slices.ContainsFunc(servers[:i], func(o mcpServer) bool { return o.Name == s.Name }) {
			errs[i], wrong = fmt.Errorf("MCP server %q is named twice", s.Name), true
			continue
		}
		wg.Go(func() {
			conns[i], lists[i], errs[i] = connectMCP(ctx, s, l)
		})
	}
	wg.Wait()
	tb := &mcpToolbox{routes: map[string]mcpRoute{}}
	for _, c := range conns {
		if c != nil {
			tb.conns = append(tb.conns, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		tb.close()
		if !wrong {
			// Servers that could not be started, reached or initialized
			// (a coordinator's endpoint that refuses the agent's token):
			// the agent cannot start now, though nothing was asked amiss.
			err = &backend.UnreachableError{Err: err}
		}
		return nil, err
	}
	for i, c := range conns {
		for _, t := range lists[i] {
			if !mcpPermitted(pol, c.name, t.Name) {
				continue
			}
			if name, ok := tb.freeName(c.name, t.Name); ok {
				tb.routes[name] = mcpRoute{conn: c, tool: t.Name}
				tb.offered = append(tb.offered, toolSpec{Name: name, Description: toolDescription(t), Parameters: toolSchema(t)})
			}
		}
	}
	return tb, nil
}

// freeName is the name to offer server's tool by: its bare name, else
// <server>__<tool>, else its qualified name. A server listing a tool twice
// has the second dropped (ok false), as has a tool all three names of
// which are taken.
func (tb *mcpToolbox) freeName(server, tool string) (name string, ok bool) {
	for _, n := range []string{tool, server + "__" + tool, "mcp__" + server + "__" + tool} {
		r, taken := tb.routes[n]
		if !taken {
			return n, true
		}
		if r.conn.name == server && r.tool == tool {
			return "", false
		}
	}
	return "", false
}

// mcpStopWait is how long a stdio server has to exit once its input ends.
const mcpStopWait = 2 * time.Second

// launch is how an agent's stdio servers are started: held by the node's
// reaper, with the agent's own environment added (its life token among
// it), as every process of the agent is.
type launch struct {
	reaper  *proc.Reaper
	sandbox *proc.Confinement
	env     []string
}

// connectMCP starts one server's transport, initializes the session and
// lists the tools.
func connectMCP(ctx context.Context, s mcpServer, l launch) (c *mcpConn, tools []mcp.Tool, err error) {
	// The transport outlives ctx, which bounds only connecting: an SSE
	// stream, say, lives as long as the context it starts with.
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, stop)
	c = &mcpConn{name: s.Name, stop: stop}
	var t transport.Interface
	switch {
	case s.Command != "":
		c.stderr = proc.NewRing(4 << 10)
		// The process lasts until close, which ends it and all it started.
		server, stdout, perr := proc.StartProcess(proc.ProcessSpec{
			Argv: append([]string{s.Command}, s.Args...), Dir: s.Dir,
			Env:    append(append(proc.NodeEnviron(), l.env...), s.Env...),
			Stderr: c.stderr, Reaper: l.reaper, Sandbox: l.sandbox,
		})
		if perr != nil {
			detach()
			stop()
			return nil, nil, fmt.Errorf("MCP server %q: %w", s.Name, perr)
		}
		c.proc = server
		t = transport.NewIO(stdout, server.Stdin(), nil)
	case s.SSE:
		t, err = transport.NewSSE(s.URL, transport.WithHeaders(s.Headers))
	default:
		t, err = transport.NewStreamableHTTP(s.URL, transport.WithHTTPHeaders(s.Headers))
	}
	if err != nil {
		detach()
		stop()
		return nil, nil, fmt.Errorf("MCP server %q: %w", s.Name, err)
	}
	c.client = client.NewClient(t)
	fail := func(doing string, err error) (*mcpConn, []mcp.Tool, error) {
		detach()
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		err = fmt.Errorf("MCP server %q: %s: %w%s", s.Name, doing, err, c.stderrNote())
		c.close()
		return nil, nil, err
	}
	if err := c.client.Start(life); err != nil {
		return fail("starting", err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "shoal", Version: "0"}
	if _, err := c.client.Initialize(ctx, init); err != nil {
		return fail("initializing", err)
	}
	res, err := c.client.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		return fail("listing its tools", err)
	}
	if !detach() {
		return fail("connecting", ctx.Err()) // ctx ended as it connected
	}
	return c, res.Tools, nil
}

// stderrNote is the last line a stdio server wrote to its standard error,
// to add to an error.
func (c *mcpConn) stderrNote() string {
	if c.stderr == nil {
		return ""
	}
	if l := proc.LastLine(c.stderr.String()); l != "" {
		return " (its stderr: " + l + ")"
	}
	return ""
}

// close ends the session: a stdio server has its input closed, then is
// signalled, then killed (mcp-go's sequence), and whatever is left in its
// process group is killed.
func (c *mcpConn) close() {
	c.client.Close()
	c.stop()
	if c.proc != nil {
		// A stdio server ends when its input does; one that does not is
		// killed, with all it started.
		c.proc.Stdin().Close()
		select {
		case <-c.proc.Done():
		case <-time.After(mcpStopWait):
			c.proc.Kill()
		}
	}
}

func toolDescription(t mcp.Tool) string {
	if t.Description != "" {
		return t.Description
	}
	return t.Title
}

// toolSchema is a tool's input schema, or an empty object's.
func toolSchema(t mcp.Tool) json.RawMessage {
	if len(t.RawInputSchema) > 0 {
		return t.RawInputSchema
	}
	if t.InputSchema.Type != "" {
		if b, err := json.Marshal(t.InputSchema); err == nil {
			return b
		}
	}
	return json.RawMessage(`{"type":"object","properties":{}}`)
}

// mcpPermitted reports whether pol lets an agent call server's tool, by
// Kaimon's rules for local models (_tool_permitted), which are the MCP
// rules Shoal's door judges by (schemas.MCPRules).
func mcpPermitted(pol schemas.Policy, server, tool string) bool {
	ok, _ := pol.Decide(schemas.ToolName{Server: strings.ToLower(server), Bare: strings.ToLower(tool)}, schemas.MCPRules)
	return ok
}

// tools implements toolbox.
func (tb *mcpToolbox) tools() []toolSpec { return slices.Clone(tb.offered) }

// call implements toolbox: it runs tools/call on the tool's server.
func (tb *mcpToolbox) call(ctx context.Context, name string, args json.RawMessage) toolResult {
	r, ok := tb.routes[name]
	if !ok {
		return failedResult(fmt.Sprintf("tool '%s' is not permitted", name))
	}
	if tb.closed.Load() {
		return failedResult(fmt.Sprintf("Error: tool '%s' cannot run: its MCP session has been closed", name))
	}
	arguments, err := callArguments(args)
	if err != nil {
		return failedResult(fmt.Sprintf("Error: tool '%s' needs its arguments as a JSON object: %v", name, err))
	}
	var req mcp.CallToolRequest
	req.Params.Name = r.tool
	req.Params.RawArguments = arguments
	res, err := r.conn.client.CallTool(ctx, req)
	if err != nil {
		note := r.conn.stderrNote()
		if r.conn.name == schemas.MCPServerName {
			note += staleEndpointNote
		}
		return failedResult(fmt.Sprintf("Error: tool '%s' on MCP server %q failed: %v%s", name, r.conn.name, err, note))
	}
	return renderResult(name, res)
}

// staleEndpointNote says what to do when Shoal's own endpoint (the
// coordinator's, the first server, which no configured one may share a
// name with) cannot be reached: an agent keeps, for its life, the address
// and token its node gave it as it opened, and a coordinator restarted
// since with another --mcp-token or address refuses them or is elsewhere.
const staleEndpointNote = ". This agent reaches Shoal's tools at the address, and with the token, its node gave it when it opened; " +
	"if the coordinator has restarted since with another --mcp-token or address, close the agent and open it again (the same id goes on) to be given the current ones"

// callArguments is the model's arguments as tools/call sends them: a JSON
// object, {} when the model gave none.
func callArguments(args json.RawMessage) (json.RawMessage, error) {
	a := bytes.TrimSpace(args)
	if len(a) == 0 || string(a) == "null" {
		return json.RawMessage("{}"), nil
	}
	if !json.Valid(a) {
		return nil, fmt.Errorf("%.200q is not JSON", a)
	}
	if a[0] != '{' {
		return nil, fmt.Errorf("%.200s is not an object", a)
	}
	return json.RawMessage(a), nil
}

func failedResult(text string) toolResult {
	return toolResult{Text: text, Content: []schemas.ToolCallContent{schemas.ToolText(text)}, Failed: true}
}

// renderResult turns a tools/call result into the model's text and the
// stream's blocks. Text blocks are joined by newlines; an image is
// "[image returned: <mime>]" in the text and itself on the stream; audio,
// resource links and embedded resources are noted likewise (a text
// resource's text is given whole); a block of any other kind is its JSON.
// Structured content stands in for blocks when there are none. The result
// failed if the server says so or its text starts with Error or ERROR.
func renderResult(name string, res *mcp.CallToolResult) toolResult {
	var texts []string
	var blocks []schemas.ToolCallContent
	add := func(text string, b schemas.ContentBlock) {
		texts = append(texts, text)
		blocks = append(blocks, schemas.ToolBlock(b))
	}
	for _, c := range res.Content {
		switch c := c.(type) {
		case mcp.TextContent:
			add(c.Text, schemas.Text(c.Text))
		case mcp.ImageContent:
			add("[image returned: "+c.MIMEType+"]", schemas.Image(c.Data, c.MIMEType))
		case mcp.AudioContent:
			add("[audio returned: "+c.MIMEType+"]", schemas.ContentBlock{Type: schemas.ContentAudio, Data: c.Data, MimeType: c.MIMEType})
		case mcp.ResourceLink:
			note := "[resource link: " + c.Name + " " + c.URI + "]"
			if c.Description != "" {
				note += " " + c.Description
			}
			add(note, schemas.ContentBlock{Type: schemas.ContentResourceLink, URI: c.URI, Name: c.Name, MimeType: c.MIMEType})
		case mcp.EmbeddedResource:
			switch r := c.Resource.(type) {
			case mcp.TextResourceContents:
				add("[resource "+r.URI+"]\n"+r.Text, schemas.ContentBlock{Type: schemas.ContentResource, URI: r.URI, Text: r.Text, MimeType: r.MIMEType})
			case mcp.BlobResourceContents:
				add("[resource returned: "+r.URI+" "+r.MIMEType+"]", schemas.ContentBlock{Type: schemas.ContentResource, URI: r.URI, Blob: r.Blob, MimeType: r.MIMEType})
			default:
				addJSON(&texts, &blocks, c)
			}
		default:
			addJSON(&texts, &blocks, c)
		}
	}
	if len(res.Content) == 0 && res.StructuredContent != nil {
		addJSON(&texts, &blocks, res.StructuredContent)
	}
	text := strings.Join(texts, "\n")
	lead := strings.TrimLeft(text, " \t\r\n")
	failed := res.IsError || strings.HasPrefix(lead, "Error") || strings.HasPrefix(lead, "ERROR")
	if failed && strings.TrimSpace(text) == "" {
		text = fmt.Sprintf("Error: tool '%s' failed and said nothing more", name)
		blocks = append(blocks, schemas.ToolText(text))
	}
	return toolResult{Text: text, Content: blocks, Failed: failed}
}

// addJSON adds a value Shoal has no rendering for as its JSON.
func addJSON(texts *[]string, blocks *[]schemas.ToolCallContent, v any) {
	b, err := json.Marshal(v)
	s := string(b)
	if err != nil {
		s = fmt.Sprintf("%v", v)
	}
	*texts = append(*texts, s)
	*blocks = append(*blocks, schemas.ToolText(s))
}

// close implements toolbox: it ends every session and kills every stdio
// server. It may be called more than once.
func (tb *mcpToolbox) close() {
	tb.closeOnce.Do(func() {
		tb.closed.Store(true)
		var wg sync.WaitGroup
		for _, c := range tb.conns {
			wg.Go(c.close)
		}
		wg.Wait()
	})
}
