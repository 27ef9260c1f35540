package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// bearer adds a bearer token to every request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// shoal up serves the MCP tools over Streamable HTTP at the endpoint it
// prints; with --mcp-token and --mcp-observer-token, a client without a
// token is turned away, the coordinator's token drives every tool and
// the observer's token only watches.
func TestUpServesMCPWithTokens(t *testing.T) {
	t.Parallel()
	up := startShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--no-bus", "--mcp-listen", "127.0.0.1:0",
		"--mcp-token", "coordinator-secret", "--mcp-observer-token", "observer-secret")
	endpoint := strings.TrimPrefix(up.waitLine("shoal: MCP endpoint "), "shoal: MCP endpoint ")
	up.waitLine("shoal: ready")
	if !strings.HasPrefix(endpoint, "http://127.0.0.1:") || !strings.HasSuffix(endpoint, "/mcp") {
		t.Fatalf("the MCP endpoint is %q", endpoint)
	}
	connect := func(token string) (*mcp.ClientSession, error) {
		client := &http.Client{}
		if token != "" {
			client.Transport = bearer(token)
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "up-test", Version: "1"}, nil)
		return c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client}, nil)
	}
	if s, err := connect(""); err == nil {
		s.Close()
		t.Fatal("a client without a token connected")
	}
	if s, err := connect("wrong"); err == nil {
		s.Close()
		t.Fatal("a client with a wrong token connected")
	}

	s, err := connect("coordinator-secret")
	if err != nil {
		t.Fatalf("connect with the token: %v", err)
	}
	defer s.Close()
	tools, err := s.ListTools(t.Context(), nil)
	if err != nil || len(tools.Tools) != len(schemas.ToolAccess) {
		t.Fatalf("the coordinator's token lists %d tools (%v), want %d", len(tools.Tools), err, len(schemas.ToolAccess))
	}
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_nodes"})
	if err != nil || res.IsError {
		t.Fatalf("agent_nodes: %+v %v", res, err)
	}
	var nodes schemas.NodesReply
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &nodes); err != nil || len(nodes.Nodes) != 1 {
		t.Fatalf("agent_nodes answered %s (%v); want the up's own node", res.Content[0].(*mcp.TextContent).Text, err)
	}
	schematest.ControlValue(t, "nodes_reply", nodes)

	obs, err := connect("observer-secret")
	if err != nil {
		t.Fatalf("connect with the observer's token: %v", err)
	}
	defer obs.Close()
	res, err = obs.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_open", Arguments: map[string]any{"cwd": t.TempDir()}})
	if err == nil && !res.IsError {
		t.Fatalf("the observer's token opened an agent: %s", res.Content[0].(*mcp.TextContent).Text)
	}
	res, err = obs.CallTool(t.Context(), &mcp.CallToolParams{Name: "agent_list"})
	if err != nil || res.IsError {
		t.Fatalf("agent_list with the observer's token: %+v %v", res, err)
	}
}

// shoal up's own MCP endpoint works on repositories of its machine, as
// the README promises of the coordinator's endpoint: open an agent on
// one, and its diff. (Its client, which connects again if the server
// closes its connection, hid the repository methods of the client it
// wraps, and every such call said the endpoint had no rights to them.)
func TestUpsMCPEndpointWorksOnRepositories(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	endpoint := c.printed("MCP endpoint ")
	s, err := mcp.NewClient(&mcp.Implementation{Name: "up-test", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	repo := oneCommitRepo(t, "repo", "hello\n")
	call := func(tool string, args map[string]any) string {
		t.Helper()
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if res.IsError {
			t.Fatalf("%s %v: %s", tool, args, text)
		}
		return text
	}
	var open schemas.OpenReply
	if err := json.Unmarshal([]byte(call("agent_open", map[string]any{"cwd": repo, "repo": true})), &open); err != nil || open.AgentID == "" {
		t.Fatalf("agent_open on a repository answered %+v (%v)", open, err)
	}
	var diff schemas.DiffReply
	if err := json.Unmarshal([]byte(call("agent_diff", map[string]any{"agent_id": open.AgentID})), &diff); err != nil {
		t.Fatalf("agent_diff: %v", err)
	}
}
