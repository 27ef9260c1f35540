package web_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/bridge"
	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
)

// The MCP listener serves the dashboard at / beside /mcp, both behind
// the token; the login cookie is HttpOnly and SameSite=Strict.
func TestServedBesideMCP(t *testing.T) {
	t.Parallel()
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const token = "secret"
	cfg := bridge.HTTPConfig{Token: token, Web: web.New(web.Config{Client: f, Token: token})}
	ctx, cancel := context.WithCancel(t.Context())
	urls, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- bridge.NewMCP(bridge.MCPConfig{Client: f}).ListenHTTP(ctx, "127.0.0.1:0", cfg, func(u string) { urls <- u })
	}()
	t.Cleanup(func() { cancel(); <-done })
	base := strings.TrimSuffix(<-urls, bridge.MCPPath)
	get := func(path string, auth bool) (int, string, *http.Response) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res
	}
	if code, body, _ := get("/", true); code != http.StatusOK || !strings.Contains(body, `<script src="/assets/app.js"`) {
		t.Errorf("GET / with the token: %d %.200s", code, body)
	}
	if code, body, _ := get("/", false); code != http.StatusUnauthorized || !strings.Contains(body, "Sign in") {
		t.Errorf("GET / without the token: %d %.200s", code, body)
	}
	if code, _, _ := get("/mcp", false); code != http.StatusUnauthorized {
		t.Errorf("GET /mcp without the token: %d", code)
	}
	code, _, res := get("/agents/x?token="+token+"&event=3", false)
	c := res.Cookies()
	if code != http.StatusSeeOther || res.Header.Get("Location") != "/agents/x?event=3" || len(c) != 1 ||
		c[0].Name != web.CookieName || c[0].Value != token || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode {
		t.Errorf("the login: %d %q %+v", code, res.Header.Get("Location"), c)
	}
}
