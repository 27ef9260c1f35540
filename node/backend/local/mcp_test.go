package local

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// The test binary doubles as the MCP servers the toolbox tests talk to,
// the way os/exec's tests re-execute themselves.
const (
	// mcpTestServerEnv set to 1 makes the test binary a stdio MCP server.
	mcpTestServerEnv = "SHOAL_LLM_TEST_MCP_SERVER"
	// mcpTestLabelEnv is what that server's label tool answers.
	mcpTestLabelEnv = "SHOAL_LLM_TEST_MCP_LABEL"
	// mcpTestPIDFileEnv names a file the server writes its pid to.
	mcpTestPIDFileEnv = "SHOAL_LLM_TEST_MCP_PIDFILE"
	// mcpTestSleeperEnv set to 1 makes the test binary sleep: the child
	// a stdio server's spawn tool starts in its process group.
	mcpTestSleeperEnv = "SHOAL_LLM_TEST_MCP_SLEEPER"
)

// TestMain is the package's only TestMain: it runs the tests, unless the
// binary was started as one of the test's helper processes.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv(mcpTestSleeperEnv) == "1":
		time.Sleep(time.Hour)
		os.Exit(0)
	case os.Getenv(mcpTestServerEnv) == "1":
		os.Exit(serveMCPTestStdio())
	}
	goleak.VerifyTestMain(m)
}

// serveMCPTestStdio serves the test MCP server on stdin and stdout until
// stdin ends.
func serveMCPTestStdio() int {
	if f := os.Getenv(mcpTestPIDFileEnv); f != "" {
		if err := os.WriteFile(f, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Fprintln(os.Stderr, "test MCP server ready")
	if err := server.ServeStdio(newMCPTestServer(os.Getenv(mcpTestLabelEnv), true)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// mcpTestPNG is a 1×1 red PNG, base64.
var mcpTestPNG = func() string {
	img := image.NewRGBA(image.Rect(0, 0, 1, 1))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}()

// newMCPTestServer is the test MCP server. The process tools (spawn,
// crash) are only on the stdio one, a process of its own.
func newMCPTestServer(label string, process bool) *server.MCPServer {
	s := server.NewMCPServer("shoal-llm-test", "0", server.WithToolCapabilities(false))
	text := func(r mcp.CallToolRequest) string { return r.GetString("text", "") }
	s.AddTool(mcp.NewTool("echo", mcp.WithDescription("Returns its text."), mcp.WithString("text", mcp.Required())),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(text(r)), nil
		})
	s.AddTool(mcp.NewTool("shout", mcp.WithString("text")),
		func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError("too loud: " + text(r)), nil
		})
	s.AddTool(mcp.NewTool("grumble"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("ERROR: disk full"), nil
		})
	s.AddTool(mcp.NewTool("picture"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultImage("a red dot", mcpTestPNG, "image/png"), nil
		})
	s.AddTool(mcp.NewTool("resources"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{
				mcp.NewResourceLink("file:///tmp/notes.md", "notes", "the notes", "text/markdown"),
				mcp.NewEmbeddedResource(mcp.TextResourceContents{URI: "file:///tmp/a.txt", MIMEType: "text/plain", Text: "alpha"}),
				mcp.NewEmbeddedResource(mcp.BlobResourceContents{URI: "file:///tmp/b.bin", MIMEType: "application/octet-stream", Blob: "AAE="}),
			}}, nil
		})
	s.AddTool(mcp.NewTool("agent_open", mcp.WithDescription("Named like the coordinator's tool.")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("opened"), nil
		})
	s.AddTool(mcp.NewTool("label"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(label), nil
		})
	if !process {
		return s
	}
	s.AddTool(mcp.NewTool("spawn"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			exe, err := os.Executable()
			if err != nil {
				return nil, err
			}
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), mcpTestSleeperEnv+"=1")
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			go cmd.Wait()
			return mcp.NewToolResultText(fmt.Sprintf("%d %d", os.Getpid(), cmd.Process.Pid)), nil
		})
	s.AddTool(mcp.NewTool("crash"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			os.Exit(3)
			return nil, nil
		})
	return s
}

// stdioTestServer is the test binary as a stdio MCP server.
func stdioTestServer(t *testing.T, name string, env ...string) mcpServer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("finding the test binary: %v", err)
	}
	// Under -race a process sleeps a second as it exits, unless told not to.
	env = append([]string{mcpTestServerEnv + "=1", mcpTestLabelEnv + "=" + name, "GORACE=atexit_sleep_ms=0"}, env...)
	return mcpServer{Name: name, Command: exe, Env: env}
}

// httpTestServer serves the test MCP server over Streamable HTTP (or the
// older HTTP+SSE) on 127.0.0.1, refusing any request without the header.
func httpTestServer(t *testing.T, label, header, value string, sse bool) string {
	t.Helper()
	mcpSrv := newMCPTestServer(label, false)
	var h http.Handler = server.NewStreamableHTTPServer(mcpSrv)
	path := "/mcp"
	if sse {
		h = server.NewSSEServer(mcpSrv)
		path = "/sse"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening on 127.0.0.1: %v", err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(header) != value {
			http.Error(w, "missing "+header, http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	}))
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL + path
}

func openTestToolbox(t *testing.T, servers []mcpServer, pol schemas.Policy) *mcpToolbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tb, err := openToolbox(ctx, servers, pol, launch{})
	if err != nil {
		t.Fatalf("openToolbox: %v", err)
	}
	t.Cleanup(tb.close)
	return tb
}

func defaultPolicy(t *testing.T) schemas.Policy {
	t.Helper()
	pol, err := schemas.ComposePolicy("default", "", nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func toolNames(tb *mcpToolbox) []string {
	var names []string
	for _, s := range tb.tools() {
		names = append(names, s.Name)
	}
	return names
}

func callTool(t *testing.T, tb *mcpToolbox, name, args string) toolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return tb.call(ctx, name, json.RawMessage(args))
}

func TestParseMCPConfig(t *testing.T) {
	t.Parallel()
	cfg := `{"mcpServers": {
		"files": {"command": "mcp-files", "args": ["--root", "/tmp"], "env": {"B": "2", "A": "1"}},
		"shoal": {"type": "http", "url": "http://127.0.0.1:7777/mcp", "headers": {"Authorization": "Bearer t"}},
		"web": {"type": "streamable-http", "url": "https://example.com/mcp"},
		"plain": {"url": "http://127.0.0.1:1/mcp"},
		"old": {"type": "sse", "url": "http://127.0.0.1:2/sse", "headers": {"X-K": "v"}},
		"typed": {"type": "stdio", "command": "srv"}
	}, "otherKey": true}`
	got, err := parseMCPConfig([]byte(cfg))
	if err != nil {
		t.Fatalf("parseMCPConfig: %v", err)
	}
	want := []mcpServer{
		{Name: "files", Command: "mcp-files", Args: []string{"--root", "/tmp"}, Env: []string{"A=1", "B=2"}},
		{Name: "shoal", URL: "http://127.0.0.1:7777/mcp", Headers: map[string]string{"Authorization": "Bearer t"}},
		{Name: "web", URL: "https://example.com/mcp"},
		{Name: "plain", URL: "http://127.0.0.1:1/mcp"},
		{Name: "old", URL: "http://127.0.0.1:2/sse", Headers: map[string]string{"X-K": "v"}, SSE: true},
		{Name: "typed", Command: "srv"},
	}
	if g, w := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want); g != w {
		t.Errorf("parseMCPConfig:\n got %s\nwant %s", g, w)
	}

	if got, err := parseMCPConfig([]byte(`{"mcpServers": {}}`)); err != nil || len(got) != 0 {
		t.Errorf("an empty mcpServers: got %v, %v; want no servers", got, err)
	}

	bad := []struct{ cfg, want string }{
		{`{"mcpServers": {"x": {"command": "a", "url": "http://h/"}}}`, `"x": has both`},
		{`{"mcpServers": {"x": {}}}`, `"x": has neither`},
		{`{"mcpServers": {"x": {"type": "websocket", "url": "ws://h/"}}}`, `"x": has unknown type "websocket"`},
		{`{"mcpServers": {"x": {"type": "http", "url": "http://h/", "headersHelper": "get-token"}}}`, `"x": json: unknown field "headersHelper"`},
		{`{"mcpServers": {"x": {"command": "a", "args": "b"}}}`, `"x": json: cannot unmarshal`},
		{`{"mcpServers": {"x": "npx srv"}}`, `"x": not a JSON object`},
		{`{"mcpServers": {"x": {"type": "http", "command": "a", "url": "http://h/"}}}`, `"x": has type "http", which takes a "url", but has "command"`},
		{`{"mcpServers": {"x": {"type": "http"}}}`, `"x": has neither a command nor a URL`},
		{`{"mcpServers": {"x": {"type": "stdio", "url": "http://h/"}}}`, `"x": is a stdio server but has "url"`},
		{`{"mcpServers": {"x": {"url": "ftp://h/"}}}`, `"x": URL "ftp://h/" is not an http or https URL`},
		{`{"mcpServers": {"a__b": {"command": "a"}}}`, `"a__b": the name has "__" in it`},
		{`{"mcpServers": {"x": {"command": "a"}, "x": {"command": "b"}}}`, `server "x" is named twice`},
		{`{"mcpServers": []}`, `not a JSON object`},
		{`{"servers": {}}`, `no "mcpServers" object`},
		{`not json`, `reading the MCP config`},
	}
	for _, c := range bad {
		_, err := parseMCPConfig([]byte(c.cfg))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseMCPConfig(%s): got error %v, want one containing %q", c.cfg, err, c.want)
		}
	}
}

func TestMCPPermitted(t *testing.T) {
	t.Parallel()
	def := defaultPolicy(t)
	specialist, err := schemas.ComposePolicy("specialist", "", []string{"echo", "mcp__files__lookup", "mcp__web"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	only, err := schemas.ComposePolicy("default", "", []string{"mcp__shoal__agent_status"}, &[]string{}, true)
	if err != nil {
		t.Fatal(err)
	}
	emptySpecialist, err := schemas.ComposePolicy("specialist", "", nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	deny := func(entries ...string) schemas.Policy {
		return schemas.Policy{Preset: schemas.PresetDefault, Disallowed: entries}
	}
	cases := []struct {
		name         string
		pol          schemas.Policy
		server, tool string
		want         bool
	}{
		{"guard hides the coordinator's agent_open", def, "shoal", "agent_open", false},
		{"guard hides agent_run", def, "shoal", "agent_run", false},
		{"guard hides agent_status, as Kaimon's does", def, "shoal", "agent_status", false},
		{"guard keeps agent_output", def, "shoal", "agent_output", true},
		{"guard is for the coordinator only", def, "other", "agent_open", true},
		{"guard lifted", deny(), "shoal", "agent_open", true},
		{"bare deny, any server", deny("echo"), "files", "echo", false},
		{"bare deny, other tool", deny("echo"), "files", "read", true},
		{"qualified deny", deny("mcp__files__echo"), "files", "echo", false},
		{"qualified deny, other server", deny("mcp__files__echo"), "web", "echo", true},
		{"server deny", deny("mcp__files"), "files", "anything", false},
		{"server deny, other server", deny("mcp__files"), "filesystem", "anything", true},
		{"deny in any case", deny("MCP__Files__ECHO"), "files", "echo", false},
		{"prefix deny", deny("mcp__shoal__agent_*"), "shoal", "agent_list", false},
		{"bare prefix deny", deny("read_*"), "files", "read_file", false},
		{"claude pattern deny", deny("Bash(rm *)"), "x", "bash", false},
		{"specialist: bare allow", specialist, "any", "echo", true},
		{"specialist: qualified allow", specialist, "files", "lookup", true},
		{"specialist: qualified allow, other server", specialist, "web2", "lookup", false},
		{"specialist: server allow", specialist, "web", "fetch", true},
		{"specialist: not listed", specialist, "files", "store", false},
		{"specialist: its native denials hide MCP tools of those names too", specialist, "web", "read", false},
		{"specialist: deny still wins", specialist, "shoal", "agent_open", false},
		{"only: listed", only, "shoal", "agent_status", true},
		{"only: not listed", only, "shoal", "agent_list", false},
		{"empty allowlist: a specialist may call nothing", emptySpecialist, "files", "store", false},
		{"empty allowlist: deny wins", emptySpecialist, "shoal", "agent_send", false},
		{"allowlist without only is no limit", schemas.Policy{Preset: schemas.PresetLab, Allowed: []string{"mcp__shoal"}}, "files", "read", true},
	}
	for _, c := range cases {
		if got := mcpPermitted(c.pol, c.server, c.tool); got != c.want {
			t.Errorf("%s: mcpPermitted(%s, %s) = %v, want %v", c.name, c.server, c.tool, got, c.want)
		}
	}
}

func TestToolboxStdio(t *testing.T) {
	t.Parallel()
	tb := openTestToolbox(t, []mcpServer{stdioTestServer(t, schemas.MCPServerName)}, defaultPolicy(t))

	names := toolNames(tb)
	if slices.Contains(names, "agent_open") {
		t.Errorf("the recursion guard left mcp__shoal__agent_open offered: %v", names)
	}
	for _, n := range []string{"echo", "shout", "grumble", "picture", "resources", "label", "spawn", "crash"} {
		if !slices.Contains(names, n) {
			t.Errorf("tool %q not offered: %v", n, names)
		}
	}
	for _, s := range tb.tools() {
		if s.Name != "echo" {
			continue
		}
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		if err := json.Unmarshal(s.Parameters, &schema); err != nil {
			t.Fatalf("echo's parameters %s: %v", s.Parameters, err)
		}
		if schema.Type != "object" || schema.Properties["text"] == nil || !slices.Equal(schema.Required, []string{"text"}) {
			t.Errorf("echo's parameters = %s, want its input schema", s.Parameters)
		}
		if s.Description != "Returns its text." {
			t.Errorf("echo's description = %q", s.Description)
		}
	}

	if r := callTool(t, tb, "echo", `{"text":"hello"}`); r.Failed || r.Text != "hello" ||
		len(r.Content) != 1 || r.Content[0] != schemas.ToolBlock(schemas.Text("hello")) {
		t.Errorf("echo: got %+v", r)
	}
	if r := callTool(t, tb, "label", ``); r.Failed || r.Text != "shoal" {
		t.Errorf("label (no arguments): got %+v, want the server's environment to say shoal", r)
	}
	if r := callTool(t, tb, "shout", `{"text":"hi"}`); !r.Failed || r.Text != "too loud: hi" {
		t.Errorf("shout: got %+v, want a failed result", r)
	}
	if r := callTool(t, tb, "grumble", `{}`); !r.Failed || r.Text != "ERROR: disk full" {
		t.Errorf("grumble: got %+v, want a failed result: its text starts with ERROR", r)
	}

	r := callTool(t, tb, "picture", `{}`)
	if r.Failed || r.Text != "a red dot\n[image returned: image/png]" {
		t.Errorf("picture: got text %q failed %v", r.Text, r.Failed)
	}
	if want := []schemas.ToolCallContent{schemas.ToolBlock(schemas.Text("a red dot")), schemas.ToolBlock(schemas.Image(mcpTestPNG, "image/png"))}; !slices.Equal(r.Content, want) {
		t.Errorf("picture: content %+v, want %+v", r.Content, want)
	}

	r = callTool(t, tb, "resources", `{}`)
	wantText := "[resource link: notes file:///tmp/notes.md] the notes\n[resource file:///tmp/a.txt]\nalpha\n[resource returned: file:///tmp/b.bin application/octet-stream]"
	if r.Failed || r.Text != wantText {
		t.Errorf("resources: got text %q, want %q", r.Text, wantText)
	}
	wantContent := []schemas.ToolCallContent{
		schemas.ToolBlock(schemas.ContentBlock{Type: schemas.ContentResourceLink, URI: "file:///tmp/notes.md", Name: "notes", MimeType: "text/markdown"}),
		schemas.ToolBlock(schemas.ContentBlock{Type: schemas.ContentResource, URI: "file:///tmp/a.txt", Text: "alpha", MimeType: "text/plain"}),
		schemas.ToolBlock(schemas.ContentBlock{Type: schemas.ContentResource, URI: "file:///tmp/b.bin", Blob: "AAE=", MimeType: "application/octet-stream"}),
	}
	if !slices.Equal(r.Content, wantContent) {
		t.Errorf("resources: content %+v, want %+v", r.Content, wantContent)
	}

	for _, name := range []string{"agent_open", "mcp__shoal__agent_open", "mcp__shoal__echo", "nope"} {
		r := callTool(t, tb, name, `{}`)
		if want := "tool '" + name + "' is not permitted"; !r.Failed || r.Text != want {
			t.Errorf("%s: got %+v, want a failed result %q", name, r, want)
		}
	}
	if r := callTool(t, tb, "echo", `["hello"]`); !r.Failed || !strings.Contains(r.Text, "JSON object") {
		t.Errorf("echo with an array: got %+v, want a failed result asking for an object", r)
	}
}

func TestToolboxGuardOnlyForCoordinator(t *testing.T) {
	t.Parallel()
	tb := openTestToolbox(t, []mcpServer{stdioTestServer(t, "other")}, defaultPolicy(t))
	if !slices.Contains(toolNames(tb), "agent_open") {
		t.Errorf("agent_open of a server not named shoal was hidden: %v", toolNames(tb))
	}
	if r := callTool(t, tb, "agent_open", `{}`); r.Failed || r.Text != "opened" {
		t.Errorf("agent_open: got %+v", r)
	}
}

func TestToolboxPolicyFilters(t *testing.T) {
	t.Parallel()
	servers := []mcpServer{stdioTestServer(t, "one"), stdioTestServer(t, "two")}
	specialist, err := schemas.ComposePolicy("specialist", "", []string{"label", "mcp__two__picture"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		pol  schemas.Policy
		want []string
	}{
		{"bare deny", schemas.Policy{Disallowed: []string{"echo", "shout", "grumble", "resources", "spawn", "crash"}},
			[]string{"picture", "agent_open", "label", "two__picture", "two__agent_open", "two__label"}},
		{"qualified deny", schemas.Policy{Disallowed: []string{"mcp__one__echo", "mcp__one__shout", "mcp__one__grumble", "mcp__one__picture", "mcp__one__resources", "mcp__one__agent_open", "mcp__one__spawn", "mcp__one__crash", "mcp__two"}},
			[]string{"label"}},
		{"server deny", schemas.Policy{Disallowed: []string{"mcp__one", "spawn", "crash", "resources", "grumble"}},
			[]string{"echo", "shout", "picture", "agent_open", "label"}},
		{"specialist allowlist", specialist, []string{"label", "picture", "two__label"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tb := openTestToolbox(t, servers, c.pol)
			got := toolNames(tb)
			slices.Sort(got)
			slices.Sort(c.want)
			if !slices.Equal(got, c.want) {
				t.Fatalf("offered %v, want %v", got, c.want)
			}
			hidden := []string{"echo", "crash"}
			for _, h := range hidden {
				if !slices.Contains(got, h) {
					if r := callTool(t, tb, h, `{}`); !r.Failed || r.Text != "tool '"+h+"' is not permitted" {
						t.Errorf("calling hidden %s: got %+v", h, r)
					}
				}
			}
		})
	}
	// Under the specialist, picture is two's alone, so it is offered bare.
	tb := openTestToolbox(t, servers, specialist)
	if r := callTool(t, tb, "two__label", `{}`); r.Text != "two" {
		t.Errorf("two__label: got %+v, want two", r)
	}
	if r := callTool(t, tb, "picture", `{}`); r.Failed || !strings.Contains(r.Text, "[image returned: image/png]") {
		t.Errorf("picture: got %+v", r)
	}
}

func TestToolboxNameCollisions(t *testing.T) {
	t.Parallel()
	tb := openTestToolbox(t, []mcpServer{stdioTestServer(t, "one"), stdioTestServer(t, "two")}, schemas.Policy{})
	got := toolNames(tb)
	want := []string{"echo", "shout", "grumble", "picture", "resources", "agent_open", "label", "spawn", "crash",
		"two__echo", "two__shout", "two__grumble", "two__picture", "two__resources", "two__agent_open", "two__label", "two__spawn", "two__crash"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("offered %v, want %v", got, want)
	}
	if r := callTool(t, tb, "label", `{}`); r.Text != "one" {
		t.Errorf("label: got %+v, want the first server's", r)
	}
	if r := callTool(t, tb, "two__label", `{}`); r.Text != "two" {
		t.Errorf("two__label: got %+v, want the second server's", r)
	}
	if r := callTool(t, tb, "two__echo", `{"text":"x"}`); r.Failed || r.Text != "x" {
		t.Errorf("two__echo: got %+v", r)
	}
}

func TestToolboxHTTP(t *testing.T) {
	t.Parallel()
	for _, sse := range []bool{false, true} {
		t.Run(map[bool]string{false: "streamable", true: "sse"}[sse], func(t *testing.T) {
			t.Parallel()
			url := httpTestServer(t, "web", "X-Test-Token", "s3cret", sse)
			srv := mcpServer{Name: schemas.MCPServerName, URL: url, SSE: sse, Headers: map[string]string{"X-Test-Token": "s3cret"}}
			tb := openTestToolbox(t, []mcpServer{srv}, defaultPolicy(t))
			names := toolNames(tb)
			if slices.Contains(names, "agent_open") || !slices.Contains(names, "echo") {
				t.Errorf("offered %v, want echo and not agent_open", names)
			}
			if r := callTool(t, tb, "echo", `{"text":"over http"}`); r.Failed || r.Text != "over http" {
				t.Errorf("echo: got %+v", r)
			}
			if r := callTool(t, tb, "picture", `{}`); r.Failed || len(r.Content) != 2 || r.Content[1].Content.Type != schemas.ContentImage {
				t.Errorf("picture: got %+v", r)
			}
			if r := callTool(t, tb, "shout", `{"text":"x"}`); !r.Failed {
				t.Errorf("shout: got %+v, want failed", r)
			}
			if r := callTool(t, tb, "agent_open", `{}`); !r.Failed || r.Text != "tool 'agent_open' is not permitted" {
				t.Errorf("agent_open: got %+v", r)
			}

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			srv.Headers = nil
			srv.Name = "noheader"
			tb2, err := openToolbox(ctx, []mcpServer{srv}, defaultPolicy(t), launch{})
			if err == nil {
				tb2.close()
				t.Fatal("a server that refuses requests without the header was opened without it")
			}
			if !strings.Contains(err.Error(), `MCP server "noheader"`) {
				t.Errorf("error %q does not name the server", err)
			}
		})
	}
}

// processGone reports whether pid has exited (a zombie no one has reaped
// yet counts as gone).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	if runtime.GOOS != "linux" {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs", what, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestToolboxCloseKillsServers(t *testing.T) {
	t.Parallel()
	tb := openTestToolbox(t, []mcpServer{stdioTestServer(t, "one")}, schemas.Policy{})
	r := callTool(t, tb, "spawn", `{}`)
	var serverPID, childPID int
	if _, err := fmt.Sscanf(r.Text, "%d %d", &serverPID, &childPID); err != nil || r.Failed {
		t.Fatalf("spawn: got %+v (%v)", r, err)
	}
	t.Cleanup(func() {
		if !processGone(childPID) {
			syscall.Kill(childPID, syscall.SIGKILL)
		}
	})
	if pid := tb.conns[0].proc.PID(); pid != serverPID {
		t.Fatalf("the server says it is pid %d, the toolbox started %d", serverPID, pid)
	}
	if processGone(serverPID) || processGone(childPID) {
		t.Fatal("the server or its child is gone before close")
	}
	tb.close()
	waitGone(t, "the stdio server", serverPID)
	waitGone(t, "the stdio server's child", childPID)
	tb.close() // again: a no-op
	if r := callTool(t, tb, "echo", `{"text":"x"}`); !r.Failed || !strings.Contains(r.Text, "closed") {
		t.Errorf("echo after close: got %+v, want a failed result", r)
	}
}

func TestToolboxServerCrash(t *testing.T) {
	t.Parallel()
	tb := openTestToolbox(t, []mcpServer{stdioTestServer(t, "one")}, schemas.Policy{})
	r := callTool(t, tb, "crash", `{}`)
	if !r.Failed || !strings.HasPrefix(r.Text, "Error: tool 'crash' on MCP server \"one\" failed") {
		t.Errorf("crash: got %+v, want a failed result naming the server", r)
	}
	if r := callTool(t, tb, "echo", `{"text":"x"}`); !r.Failed || !strings.Contains(r.Text, `MCP server "one"`) {
		t.Errorf("echo after the server died: got %+v, want a failed result", r)
	}
}

func TestToolboxConnectFailure(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	good := stdioTestServer(t, "good", mcpTestPIDFileEnv+"="+pidFile)
	missing := mcpServer{Name: "missing", Command: filepath.Join(t.TempDir(), "no-such-server")}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary without the server variable runs the tests (none,
	// by -test.run), prints and exits: not an MCP server.
	notMCP := mcpServer{Name: "notmcp", Command: exe, Args: []string{"-test.run=^$"}, Env: []string{"GORACE=atexit_sleep_ms=0"}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tb, err := openToolbox(ctx, []mcpServer{good, missing, notMCP, good}, schemas.Policy{}, launch{})
	if err == nil || tb != nil {
		t.Fatalf("openToolbox: got %v, %v; want an error", tb, err)
	}
	for _, want := range []string{`MCP server "missing": could not launch`, `MCP server "notmcp": initializing`, `MCP server "good" is named twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `MCP server "good":`) {
		t.Errorf("error %q blames the good server", err)
	}
	if _, ok := errors.AsType[*backend.UnreachableError](err); ok {
		t.Errorf("error %q, with a server named twice, is taken for servers unreachable, not a wrong configuration", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the good server never started: %v", err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the good server, after the others failed", pid)
}

func TestToolboxConnectTimeout(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A server that never answers.
	hang := make(chan struct{})
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	t.Cleanup(func() { close(hang) })
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = openToolbox(ctx, []mcpServer{{Name: "slow", URL: ts.URL + "/mcp"}}, schemas.Policy{}, launch{})
	if err == nil || !strings.Contains(err.Error(), `MCP server "slow"`) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("openToolbox against a server that never answers: got %v, want a deadline error naming it", err)
	}
	if _, ok := errors.AsType[*backend.UnreachableError](err); !ok {
		t.Errorf("openToolbox against a server that never answers: %v is not an UnreachableError, which the node answers as unavailable", err)
	}
}
