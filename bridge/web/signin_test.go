package web_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalfabric/shoal/bridge/web"
)

// A link of another site carrying ?token= signs nobody in or out, in a
// real Chromium: the page stored any token it was given in its cookie,
// so another site could sign a person out, or into the observer's token.
func TestAnotherSitesLinkSignsNobodyIn(t *testing.T) {
	t.Parallel()
	const token, observer = "full-secret", "observer-secret"
	d := startDash(t, web.Config{Token: token, ObserverToken: observer})
	// localhost is another site than 127.0.0.1, where the dashboard is.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	evil := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><a id="out" href="%s/?token=nonsense">out</a> <a id="down" href="%s/?token=%s">down</a>`, d.url, d.url, observer)
	}))
	evil.Listener.Close()
	evil.Listener = l
	evil.Start()
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)

	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(d.url+"/?token="+token))
	waitJS(t, ctx, "signed in with the full token", `window.shoal && window.shoal.role === "full"`, 20*time.Second)
	for _, link := range []string{"#out", "#down"} {
		do(t, ctx, chromedp.Navigate(evilURL))
		eval[bool](t, ctx, `(document.querySelector("`+link+`").click(), true)`)
		// The click's navigation has reached the dashboard and its page
		// has loaded (a fixed wait could end first on a loaded machine:
		// the link then went untried, or its late navigation replaced the
		// page checked below).
		waitJS(t, ctx, "the link's navigation to the dashboard", `location.href.startsWith(`+jsString(d.url+"/")+`) && document.readyState === "complete"`, 30*time.Second)
		do(t, ctx, chromedp.Navigate(d.url+"/"))
		waitJS(t, ctx, "the dashboard knows who it serves", `window.shoal && window.shoal.role`, 20*time.Second)
		if role := eval[string](t, ctx, `window.shoal.role`); role != "full" {
			t.Errorf("after another site's link %s, the dashboard shows %q; want the person still signed in as full", link, role)
		}
	}
}

// A wrong token is told so and stored nowhere; a right one is stored; no
// page may be framed (clickjacking: a nearly transparent frame of the
// dashboard under another page's buttons).
func TestSignInAndFraming(t *testing.T) {
	t.Parallel()
	const token = "full-secret"
	d := startDash(t, web.Config{Token: token})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, header map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, d.url+path, nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		rep, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rep.Body.Close()
		if rep.Header.Get("X-Frame-Options") != "DENY" || !strings.Contains(rep.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s may be framed: X-Frame-Options %q, Content-Security-Policy %q", path, rep.Header.Get("X-Frame-Options"), rep.Header.Get("Content-Security-Policy"))
		}
		return rep
	}
	if rep := get("/?token=wrong", nil); rep.StatusCode != http.StatusUnauthorized || len(rep.Cookies()) != 0 {
		t.Errorf("a wrong token: %d, cookies %v; want 401 and none", rep.StatusCode, rep.Cookies())
	}
	if rep := get("/?token="+token, map[string]string{"Sec-Fetch-Site": "cross-site"}); rep.StatusCode != http.StatusSeeOther || len(rep.Cookies()) != 0 {
		t.Errorf("the right token from another site's link: %d, cookies %v; want a redirect and none", rep.StatusCode, rep.Cookies())
	}
	if rep := get("/?token="+token, map[string]string{"Sec-Fetch-Site": "same-site"}); rep.StatusCode != http.StatusSeeOther || len(rep.Cookies()) != 0 {
		t.Errorf("the right token from a sibling subdomain's link: %d, cookies %v; want a redirect and none", rep.StatusCode, rep.Cookies())
	}
	if rep := get("/?token="+token, map[string]string{"Sec-Fetch-Site": "none"}); rep.StatusCode != http.StatusSeeOther || len(rep.Cookies()) != 1 {
		t.Errorf("the right token typed in: %d, cookies %v; want a redirect and the cookie", rep.StatusCode, rep.Cookies())
	}
	for _, path := range []string{"/", "/agents/x", "/api/fleet", "/assets/app.js"} {
		get(path, map[string]string{"Authorization": "Bearer " + token})
	}
	// The scheme is read in any case (RFC 9110): "bearer" was told the
	// right token was not one the dashboard accepts.
	for _, scheme := range []string{"bearer ", "BEARER ", "Bearer  "} {
		if rep := get("/api/fleet", map[string]string{"Authorization": scheme + token}); rep.StatusCode != http.StatusOK {
			t.Errorf("the right token under the scheme %q: %d", scheme, rep.StatusCode)
		}
	}
}
