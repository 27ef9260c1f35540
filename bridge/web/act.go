package web

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"

	"github.com/shoalfabric/shoal/schemas"
)

// codeForbidden is the wire code of an action a token may not take.
const codeForbidden schemas.ErrorCode = "forbidden"

// By is how the dashboard names itself in a permission answer.
const By = "web"

// act guards an action: the full token only, from the dashboard's own
// origin, with a JSON body.
func (h *Handler) act(do func(w http.ResponseWriter, r *http.Request, body []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if roleOf(r.Context()) != roleFull {
			writeJSON(w, http.StatusForbidden, schemas.ErrorReply{Error: &schemas.ControlError{Code: codeForbidden, Message: "this token may only watch"}})
			return
		}
		if !sameOrigin(r) {
			writeJSON(w, http.StatusForbidden, schemas.ErrorReply{Error: &schemas.ControlError{Code: codeForbidden, Message: "origin not allowed: " + r.Header.Get("Origin")}})
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
	rep, err := h.cfg.Client.Open(r.Context(), req)
	if err != nil {
		h.fail(w, "opening an agent", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *Handler) send(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.SendRequest
	if !h.decode(w, body, &req) {
		return
	}
	req.AgentID = r.PathValue("id")
	rep, err := h.cfg.Client.Send(r.Context(), req)
	if err != nil {
		h.fail(w, "sending a turn", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *Handler) interrupt(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.AgentRequest
	if !h.decode(w, body, &req) {
		return
	}
	req.AgentID = r.PathValue("id")
	rep, err := h.cfg.Client.Interrupt(r.Context(), req)
	if err != nil {
		h.fail(w, "interrupting", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *Handler) close(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.AgentRequest
	if !h.decode(w, body, &req) {
		return
	}
	req.AgentID = r.PathValue("id")
	rep, err := h.cfg.Client.Close(r.Context(), req)
	if err != nil {
		h.fail(w, "closing", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *Handler) setModel(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.SetModelRequest
	if !h.decode(w, body, &req) {
		return
	}
	req.AgentID = r.PathValue("id")
	rep, err := h.cfg.Client.SetModel(r.Context(), req)
	if err != nil {
		h.fail(w, "setting the model", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *Handler) permit(w http.ResponseWriter, r *http.Request, body []byte) {
	var req schemas.PermitRequest
	if !h.decode(w, body, &req) {
		return
	}
	req.AgentID = r.PathValue("id")
	req.By = By
	if _, err := schemas.ParseDecision(string(req.Decision)); err != nil {
		writeJSON(w, http.StatusBadRequest, schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "%v", err)})
		return
	}
	rep, err := h.cfg.Client.Permit(r.Context(), req)
	if err != nil {
		h.fail(w, "answering a permission request", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
