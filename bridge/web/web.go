package web

import (
	"embed"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

//go:embed assets
var assets embed.FS

// Config configures the dashboard; only Client is required.
type Config struct {
	// Client reads and drives the fabric.
	Client client.Client
	// Token is the full bearer token: it may watch and act. When neither
	// token is set, every request may act (a loopback listener only).
	Token string
	// ObserverToken may only watch.
	ObserverToken string
	// Origin is where browsers reach the dashboard through a reverse
	// proxy ("https://shoal.example.com"): the scheme, host and port
	// their pages come from, which the Host the proxy sends on need not
	// be. Actions from it are taken as from the dashboard's own site,
	// the sign-in cookie is Secure when it is https, and no request is
	// let in without a token (the proxy's come from loopback). Empty:
	// the dashboard is reached directly.
	Origin string
	// Logger receives the dashboard's failures; slog.Default when nil.
	Logger *slog.Logger
}

// Handler serves the dashboard.
type Handler struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	streams streams
}

// New returns the dashboard's handler for cfg.
func New(cfg Config) *Handler {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{cfg: cfg, log: log.With("component", "web"), mux: http.NewServeMux(), streams: streams{open: map[string]int{}}}
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	page := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		http.ServeFileFS(w, r, static, "index.html")
	}
	h.mux.HandleFunc("GET /{$}", page)
	h.mux.HandleFunc("GET /agents/{id}", page)
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", files))
	h.mux.HandleFunc("GET /api/whoami", h.whoami)
	h.mux.HandleFunc("GET /api/fleet", h.fleet)
	h.mux.HandleFunc("GET /api/agents/{id}", h.agent)
	h.mux.HandleFunc("GET /api/agents/{id}/events", h.events)
	h.mux.HandleFunc("GET /api/agents/{id}/diff", h.diff)
	h.mux.HandleFunc("POST /api/open", h.act(schemas.AccessOpen, "open agents", h.open))
	h.mux.HandleFunc("POST /api/agents/{id}/send", h.act(schemas.AccessAct, "send to", h.send()))
	h.mux.HandleFunc("POST /api/agents/{id}/interrupt", h.act(schemas.AccessAct, "interrupt", h.interrupt()))
	h.mux.HandleFunc("POST /api/agents/{id}/close", h.act(schemas.AccessAct, "close", h.close()))
	h.mux.HandleFunc("POST /api/agents/{id}/model", h.act(schemas.AccessAct, "set the model of", h.setModel()))
	h.mux.HandleFunc("POST /api/agents/{id}/permit", h.act(schemas.AccessAnswer, "answer a permission request of", h.permit()))
	return h
}

// ServeHTTP checks the caller's token (or takes it from ?token= into a
// cookie) and serves the dashboard.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// No page of the dashboard shows inside another page's frame: a page
	// of any origin framing it, nearly transparent, could make a
	// signed-in person's clicks close agents or answer permission
	// requests (clickjacking).
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
	if r.Method == http.MethodGet && r.URL.Query().Has("token") {
		h.login(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/assets/") {
		h.mux.ServeHTTP(w, r) // the embedded styles and script hold no data
		return
	}
	p, ok := h.principal(r)
	if ok && p.Kind != schemas.KindPerson {
		err := schemas.Decide(p, schemas.AccessSideDoor, schemas.Target{}).Err(p, "use the dashboard", schemas.Target{})
		h.log.Warn("an agent was refused the dashboard", "agent", p.Agent, "path", r.URL.Path)
		if isAPI(r) {
			writeJSON(w, http.StatusForbidden, schemas.ErrorReply{Error: err.(*schemas.ControlError)})
		} else {
			http.Error(w, err.Error(), http.StatusForbidden)
		}
		return
	}
	if !ok {
		if r.Method == http.MethodGet && !isAPI(r) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			page := loginPage
			if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
				// Signed in with a token this coordinator does not have.
				page = strings.Replace(page, "<form", wrongToken+"<form", 1)
			}
			w.Write([]byte(page))
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="shoal"`)
		msg := "a bearer token is required"
		if c, err := r.Cookie(CookieName); r.Header.Get("Authorization") != "" || (err == nil && c.Value != "") {
			msg = "the token is not one this dashboard accepts (its full or observer token)"
		}
		http.Error(w, msg, http.StatusUnauthorized)
		return
	}
	h.mux.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), p)))
}
