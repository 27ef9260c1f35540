package main

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// withOrigin sends a browser's Origin and a bearer token on every request,
// each on a connection of its own.
type withOrigin struct{ origin, token string }

var oneShot = &http.Transport{DisableKeepAlives: true}

func (o withOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+o.token)
	r.Header.Set("Origin", o.origin)
	return oneShot.RoundTrip(r)
}

// shoal up behind a reverse proxy that sends on its own Host (as
// nginx's proxy_pass to an address does): with --public-url, an MCP
// client of a browser's origin and the dashboard's actions work through
// the proxy; another origin is still refused. A --public-url that cannot
// be the proxy's address, or one without a token, is refused naming why.
func TestUpBehindAReverseProxy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--public-url", "ftp://shoal.example", "--mcp-token", "t"}, "http:// or https://"},
		{[]string{"--public-url", "https://shoal.example/shoal/", "--mcp-token", "t"}, "give no path"},
		{[]string{"--public-url", "https://shoal.example"}, "--public-url needs --mcp-token"},
		{[]string{"--public-url", "https://shoal.example", "--mcp-token", "t", "--no-mcp"}, "--no-mcp turns off"},
	} {
		if code, _, errOut := runShoal(t, t.TempDir(), nil, append([]string{"up", "--port", "-1", "--no-bus"}, c.args...)...); code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("shoal up %s: exit %d, %q; want %d saying %q", strings.Join(c.args, " "), code, errOut, exitUsage, c.want)
		}
	}

	const token = "coordinator-secret"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public := "http://localhost:" + strings.TrimPrefix(l.Addr().String(), "127.0.0.1:")
	c := startCoordinator(t, nil, "--mcp-token", token, "--public-url", public+"/")
	if got := c.printed("reached through "); !strings.HasPrefix(got, public+"/ ") {
		t.Errorf("shoal up said it is reached through %q; want %s/", got, public)
	}
	target, _ := url.Parse(strings.TrimSuffix(c.printed("MCP endpoint "), "/mcp"))
	proxy := &http.Server{Handler: &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, FlushInterval: -1,
		Transport: &http.Transport{DisableKeepAlives: true}}}
	go proxy.Serve(l)
	t.Cleanup(func() { proxy.Close() })

	connect := func(origin string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "proxy-test", Version: "1"}, nil).Connect(t.Context(),
			&mcp.StreamableClientTransport{Endpoint: public + "/mcp", HTTPClient: &http.Client{Transport: withOrigin{origin, token}}}, nil)
	}
	s, err := connect(public)
	if err != nil {
		t.Fatalf("an MCP client of the public origin, through the proxy: %v", err)
	}
	if _, err := s.ListTools(t.Context(), nil); err != nil {
		t.Errorf("listing the tools through the proxy: %v", err)
	}
	s.Close()
	if s, err := connect("https://evil.example"); err == nil {
		s.Close()
		t.Error("an MCP client of another origin connected through the proxy")
	}

	for origin, want := range map[string]int{public: http.StatusOK, "https://evil.example": http.StatusForbidden} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, public+"/api/open", strings.NewReader(`{"cwd": "`+t.TempDir()+`"}`))
		req.Header.Set("Content-Type", "application/json")
		rep, err := (&http.Client{Transport: withOrigin{origin, token}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rep.Body.Close()
		if rep.StatusCode != want {
			t.Errorf("the dashboard's open from origin %s through the proxy answered %d, want %d", origin, rep.StatusCode, want)
		}
	}
}
