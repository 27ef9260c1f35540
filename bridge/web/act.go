package web

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"path/filepath"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// By is how the dashboard names itself in a permission answer.
const By = "web"

// act guards an action: what schemas.Decide allows the principal (the
// full token: everything; the observer's: nothing), from the dashboard's
// own origin, with a JSON body.
func (h *Handler) act(a schemas.Access, what string, do func(w http.ResponseWriter, r *http.Request, body []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := principalOf(r.Context())
		t := schemas.Target{Agent: r.PathValue("id")}
		if err := schemas.Decide(p, a, t).Err(p, what, t); err != nil {
			writeJSON(w, http.StatusForbidden, schemas.ErrorReply{Error: err.(*schemas.ControlError)})
			return
		}
		if !h.sameOrigin(r) {
			writeJSON(w, http.StatusForbidden, schemas.ErrorReply{Error: &schemas.ControlError{Code: schemas.CodeForbidden, Message: "origin not allowed: " + r.Header.Get("Origin")}})
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			writeJSON(w, http.StatusUnsupportedMediaType, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "an action's body is JSON (Content-Type: application/json)")})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<20))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "reading the body: %v", err)})
			return
		}
		do(w, r, body)
	}
}

// decode reads body into v, answering 400 when it does not fit.
func (h *Handler) decode(w http.ResponseWriter, body []byte, v any) bool {
	if len(body) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeJSON(w, http.StatusBadRequest, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "the body: %v", err)})
		return false
	}
	return true
}

func (h *Handler) open(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.OpenRequest
	if !h.decode(w, body, &req) {
		return
	}
	if req.Parent != "" || req.Depth != 0 {
		writeJSON(w, http.StatusBadRequest, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "parent and depth are set by the MCP door, not by a person")})
		return
	}
	var rep schemas.OpenReply
	var err error
	if req.Repo {
		rep, err = h.openRepo(r.Context(), req)
	} else {
		rep, err = h.cfg.Client.Open(r.Context(), req)
	}
	if err != nil {
		h.fail(w, "opening an agent", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// repos is the dashboard's client as a client.Repositories (one with
// the coordinator's rights), or why it is not one.
func (h *Handler) repos() (client.Repositories, error) {
	r, ok := h.cfg.Client.(client.Repositories)
	if !ok {
		return nil, schemas.Errf(schemas.CodeForbidden, "repositories need the coordinator's credentials, which this dashboard's client does not have")
	}
	return r, nil
}

// openRepo opens an agent on the repository at req.CWD of the dashboard's
// machine, which only a person with every right may have read.
func (h *Handler) openRepo(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	p := principalOf(ctx)
	if err := schemas.Decide(p, schemas.AccessFiles, schemas.Target{}).Err(p, "open agents on a repository", schemas.Target{}); err != nil {
		return schemas.OpenReply{}, err
	}
	if !filepath.IsAbs(req.CWD) {
		return schemas.OpenReply{}, schemas.Errf(schemas.CodeInvalid, "the repository %q is not an absolute path", req.CWD)
	}
	r, err := h.repos()
	if err != nil {
		return schemas.OpenReply{}, err
	}
	return r.OpenRepo(ctx, req, client.RepoSource{Dir: req.CWD, Ref: req.Ref, WithChanges: req.WithChanges})
}

// diff is an agent's work on its repository: GET /api/agents/{id}/diff,
// with ?stat=1 a summary.
func (h *Handler) diff(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rc, err := h.repos()
	if err == nil {
		var rep schemas.DiffReply
		if rep, err = rc.Diff(r.Context(), id, r.URL.Query().Get("stat") == "1"); err == nil {
			writeJSON(w, http.StatusOK, rep)
			return
		}
	}
	h.fail(w, "reading the work of agent "+id, err)
}

// onAgent adapts a client call on the agent the path names: the body is
// the request, the path's id its agent, and the reply or the error the
// answer. prepare, when given, completes or refuses the request.
func onAgent[Req, Rep any](h *Handler, what string, setID func(*Req, string), call func(context.Context, Req) (Rep, error), prepare func(*Req) error) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req Req
		if !h.decode(w, body, &req) {
			return
		}
		setID(&req, r.PathValue("id"))
		if prepare != nil {
			if err := prepare(&req); err != nil {
				writeJSON(w, http.StatusBadRequest, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "%v", err)})
				return
			}
		}
		rep, err := call(r.Context(), req)
		if err != nil {
			h.fail(w, what, err)
			return
		}
		writeJSON(w, http.StatusOK, rep)
	}
}

func (h *Handler) send() func(http.ResponseWriter, *http.Request, []byte) {
	return onAgent(h, "sending a turn", func(r *schemas.SendRequest, id string) { r.AgentID = id }, h.cfg.Client.Send, nil)
}

func (h *Handler) interrupt() func(http.ResponseWriter, *http.Request, []byte) {
	return onAgent(h, "interrupting", func(r *schemas.AgentRequest, id string) { r.AgentID = id }, h.cfg.Client.Interrupt, nil)
}

func (h *Handler) close() func(http.ResponseWriter, *http.Request, []byte) {
	return onAgent(h, "closing", func(r *schemas.AgentRequest, id string) { r.AgentID = id }, h.cfg.Client.Close, nil)
}

func (h *Handler) setModel() func(http.ResponseWriter, *http.Request, []byte) {
	return onAgent(h, "setting the model", func(r *schemas.SetModelRequest, id string) { r.AgentID = id }, h.cfg.Client.SetModel, nil)
}

// permit answers a permission request, as the dashboard.
func (h *Handler) permit() func(http.ResponseWriter, *http.Request, []byte) {
	return onAgent(h, "answering a permission request", func(r *schemas.PermitRequest, id string) { r.AgentID = id }, h.cfg.Client.Permit,
		func(r *schemas.PermitRequest) error {
			r.By = By
			_, err := schemas.ParseDecision(string(r.Decision))
			return err
		})
}
