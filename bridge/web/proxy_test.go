package web_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
)

// A dashboard reached through a reverse proxy that gives it its own Host
// (as nginx's proxy_pass to an address does): a person signed in through
// the proxy, in a real Chromium, acts, since the proxy's origin is the
// configured one; without it every action was refused (the browser's
// Origin is the proxy's, never the Host the dashboard sees). Another
// origin is still refused.
func TestDashboardBehindAReverseProxy(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// localhost, not 127.0.0.1: the browser's origin differs from the
	// Host the proxy sends on.
	public := "http://localhost:" + strings.TrimPrefix(l.Addr().String(), "127.0.0.1:")
	d := startDash(t, web.Config{Token: token, Origin: public})
	target, _ := url.Parse(d.url)
	proxy := &http.Server{Handler: &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) }, // Host: the dashboard's
		FlushInterval: -1,                                                  // the event streams
		Transport:     &http.Transport{DisableKeepAlives: true},            // nothing left open for the goroutine check
	}}
	go proxy.Serve(l)
	t.Cleanup(func() { proxy.Close() })

	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(public+"/?token="+token))
	waitJS(t, ctx, "signed in through the proxy", `window.shoal && window.shoal.role === "full"`, 20*time.Second)
	dir := t.TempDir()
	reply := eval[string](t, ctx, `fetch("/api/open", {method: "POST", headers: {"Content-Type": "application/json"},
		body: JSON.stringify({cwd: `+jsString(dir)+`})}).then(r => r.text().then(b => r.status + " " + b))`)
	if !strings.HasPrefix(reply, "200 ") || !strings.Contains(reply, `"agent_id"`) {
		t.Fatalf("opening an agent through the proxy answered %s", reply)
	}

	for origin, want := range map[string]int{public: http.StatusOK, "http://localhost:1": http.StatusForbidden, "https://evil.example": http.StatusForbidden} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, public+"/api/open", strings.NewReader(`{"cwd": `+jsString(dir)+`}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Origin", origin)
		rep, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rep.Body.Close()
		if rep.StatusCode != want {
			t.Errorf("an open from origin %s through the proxy answered %d, want %d", origin, rep.StatusCode, want)
		}
	}
}

// Behind a proxy that ends TLS, the dashboard is reached over plain HTTP,
// but its browsers over HTTPS: the sign-in cookie is Secure when the
// configured origin is https, so the browser never sends it in clear.
func TestSignInCookieIsSecureBehindAnHTTPSOrigin(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for origin, secure := range map[string]bool{"https://shoal.example": true, "http://shoal.example:8080": false, "": false} {
		h := web.New(web.Config{Client: f, Token: token, Origin: origin})
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:7270/?token="+token, nil)
		req.Header.Set("Sec-Fetch-Site", "none")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		cookies := rec.Result().Cookies()
		if len(cookies) != 1 || cookies[0].Secure != secure {
			t.Errorf("origin %q: the sign-in set %v; want one cookie, Secure %v", origin, cookies, secure)
		}
	}
}

// Behind a proxy every request comes from loopback, and may name a
// loopback Host: with an origin configured and no token, nobody is let
// in, rather than everyone who reaches the proxy with every right.
func TestNobodyIsLetInBehindAProxyWithoutAToken(t *testing.T) {
	t.Parallel()
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for origin, want := range map[string]int{"https://shoal.example": http.StatusUnauthorized, "": http.StatusOK} {
		rec := httptest.NewRecorder()
		web.New(web.Config{Client: f, Origin: origin}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1:7270/api/whoami", nil))
		if rec.Code != want {
			t.Errorf("origin %q, no token: a loopback request answered %d, want %d", origin, rec.Code, want)
		}
	}
}

// With a public https origin, a page of the same host over plain http is
// another origin, though its Origin's host is the Host the proxy sends.
func TestPublicOriginHoldsItsScheme(t *testing.T) {
	t.Parallel()
	f, err := client.NewDirect(natstest.Connect(t, natstest.Start(t)), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := web.New(web.Config{Client: f, Token: "full-secret", Origin: "https://shoal.example"})
	for origin, want := range map[string]bool{"http://shoal.example": false, "https://shoal.example": true} {
		req := httptest.NewRequest(http.MethodPost, "http://shoal.example/api/agents/x/close", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer full-secret")
		req.Header.Set("Origin", origin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if refused := strings.Contains(rec.Body.String(), "origin not allowed"); refused == want {
			t.Errorf("an action from %s: %d %s", origin, rec.Code, rec.Body.String())
		}
	}
}
