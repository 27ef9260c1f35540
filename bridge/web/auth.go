package web

import (
	"context"
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// CookieName is the cookie the token login sets.
const CookieName = "shoal_token"

// principalKey carries the request's principal.
type principalKey struct{}

func withPrincipal(ctx context.Context, p schemas.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalOf(ctx context.Context) schemas.Principal {
	p, _ := ctx.Value(principalKey{}).(schemas.Principal)
	return p
}

// roleName is what the pages are told of the principal's role.
func roleName(p schemas.Principal) string {
	if p.Kind != schemas.KindPerson {
		return "none"
	}
	return string(p.Role)
}

// principal reads who makes the request. An agent is known by the marks
// its node and proxy put on its requests to Shoal (its id header, its own
// token): the dashboard is no door of an agent's, and schemas.Decide
// refuses it. A person is known by a token from its Authorization header
// or the login cookie; with no token configured, a request naming a
// loopback host is a person with every right: the listener is on
// loopback, and the host check keeps a page on another site from reaching
// it through DNS rebinding. ok is false for no principal at all.
func (h *Handler) principal(r *http.Request) (p schemas.Principal, ok bool) {
	got, bearer := schemas.BearerToken(r.Header.Get("Authorization"))
	if !bearer {
		if c, err := r.Cookie(CookieName); err == nil {
			got = c.Value
		}
	}
	if _, marked := r.Header[http.CanonicalHeaderKey(schemas.AgentIDHeader)]; marked || schemas.IsAgentToken(got) {
		return schemas.Principal{Kind: schemas.KindAgent, Agent: r.Header.Get(schemas.AgentIDHeader)}, true
	}
	if h.cfg.Token == "" && h.cfg.ObserverToken == "" {
		// Behind a proxy every request comes from loopback, and its
		// Host may be too: nobody is let in without a token.
		return schemas.Person(schemas.RoleFull), h.cfg.Origin == "" && isLoopbackHost(hostOnly(r.Host))
	}
	switch {
	case matches(got, h.cfg.Token):
		return schemas.Person(schemas.RoleFull), true
	case matches(got, h.cfg.ObserverToken):
		return schemas.Person(schemas.RoleObserver), true
	}
	return schemas.Principal{}, false
}

// login stores ?token= in an HttpOnly cookie and redirects to the same
// page without it, so the token leaves the address bar and the history.
// Only one of this coordinator's tokens is stored, and only from a link
// of this origin or one typed in: another site's link could otherwise
// sign a person out, or into the observer's token (login CSRF). Either
// way the cookie is left as it was.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	token := q.Get("token")
	q.Del("token")
	to := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
	if !strings.HasPrefix(to.Path, "/") || strings.HasPrefix(to.Path, "//") {
		to.Path = "/"
	}
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case r.Header.Get("Sec-Fetch-Site") == "cross-site", r.Header.Get("Sec-Fetch-Site") == "same-site":
		// same-site: another origin of the same site (a sibling
		// subdomain), which is not the dashboard's either.
		h.log.Warn("a link from another origin carried a dashboard token; not signed in", "referer", r.Header.Get("Referer"))
		http.Redirect(w, r, to.String(), http.StatusSeeOther)
		return
	case !matches(token, h.cfg.Token) && !matches(token, h.cfg.ObserverToken):
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(strings.Replace(loginPage, "<form", wrongToken+"<form", 1)))
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: token, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
		// Over TLS to the browser, here or at the proxy in front.
		Secure: r.TLS != nil || strings.HasPrefix(h.cfg.Origin, "https://"),
	})
	http.Redirect(w, r, to.String(), http.StatusSeeOther)
}

// sameOrigin refuses an action from another site's page: a browser sends
// Origin on every cross-origin POST, and the JSON content type the
// actions require cannot be sent cross-origin without a preflight this
// server never answers. The dashboard's own pages come from the Host
// asked for, or, behind a proxy, from the configured origin.
func (h *Handler) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || (h.cfg.Origin != "" && o == h.cfg.Origin) {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return false
	}
	// The public host is the dashboard's over the public scheme alone (a
	// page of it over plain http is another origin); reached directly,
	// by another name, over the scheme the request came by.
	if pub, err := url.Parse(h.cfg.Origin); err == nil && h.cfg.Origin != "" && u.Host == pub.Host {
		return false // not the public origin, which matched above
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme
}

func isAPI(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/api/") }

// matches compares a presented token with a configured one in constant
// time; an unset token matches nothing.
func matches(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// wrongToken heads the sign-in page after a token that is not this
// coordinator's.
const wrongToken = `<p class="error" role="alert">The token you signed in with is not this coordinator's: give its --mcp-token (or --mcp-observer-token).</p>`

// loginPage is shown to a browser without a valid token.
const loginPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Shoal: sign in</title><link rel="stylesheet" href="/assets/app.css"></head>
<body><main class="login"><h1>Shoal</h1>
<p>This dashboard needs the coordinator's MCP token (<code>--mcp-token</code>, or <code>--mcp-observer-token</code> to watch only).</p>
<form method="get" action="/"><label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button></form></main></body></html>
`
