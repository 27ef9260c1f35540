package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// Fleet is the fleet page's data: GET /api/fleet.
type Fleet struct {
	// Now is the server's clock (Unix seconds), to age heartbeats by.
	Now     float64                `json:"now"`
	Role    string                 `json:"role"`
	Nodes   []schemas.NodeRecord   `json:"nodes"`
	Agents  []schemas.AgentRecord  `json:"agents"`
	Pending []schemas.PermitRecord `json:"pending"`
	// ByNode and ByModel are what the fleet's turns used per node that
	// ran them and per agent's model, from the coordinator's count (as
	// shoal usage --by node and --by model sum the stream): every life
	// of an id and the agents whose records are gone count. Both are
	// empty when the count cannot be read.
	ByNode  map[string]schemas.Usage `json:"tokens_by_node"`
	ByModel map[string]schemas.Usage `json:"tokens_by_model"`
	// Spend is every budget with what was used against it, and the
	// coordinator's count of what the fleet's turns used; nil when it
	// cannot be read.
	Spend *schemas.BudgetsReply `json:"spend,omitempty"`
}

func (h *Handler) fleet(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	nodes, err := h.cfg.Client.Nodes(ctx)
	if err != nil {
		h.fail(w, "listing the nodes", err)
		return
	}
	agents, err := h.cfg.Client.List(ctx)
	if err != nil {
		h.fail(w, "listing the agents", err)
		return
	}
	pending, err := h.cfg.Client.Pending(ctx)
	if err != nil {
		h.fail(w, "listing the permission requests", err)
		return
	}
	f := Fleet{
		Now:     float64(time.Now().UnixNano()) / 1e9,
		Role:    roleName(principalOf(ctx)),
		Nodes:   nonNil(nodes),
		Agents:  nonNil(agents),
		Pending: nonNil(pending.Requests),
		ByNode:  map[string]schemas.Usage{},
		ByModel: map[string]schemas.Usage{},
	}
	if rep, err := h.cfg.Client.Budgets(ctx); err == nil {
		f.Spend = &rep
		for _, r := range rep.Spent.Rows {
			n, m := f.ByNode[r.Node], f.ByModel[r.Model]
			n.Add(r.Usage)
			m.Add(r.Usage)
			f.ByNode[r.Node], f.ByModel[r.Model] = n, m
		}
	} else {
		h.log.Warn("reading the budgets for the fleet page", "err", err)
	}
	writeJSON(w, http.StatusOK, f)
}

// AgentPage is an agent's page data: GET /api/agents/{id}.
type AgentPage struct {
	Role    string                 `json:"role"`
	Record  schemas.AgentRecord    `json:"record"`
	Pending []schemas.PermitRecord `json:"pending"`
}

func (h *Handler) agent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec, err := h.cfg.Client.Status(r.Context(), id)
	if err != nil {
		h.fail(w, "reading agent "+id, err)
		return
	}
	pending, err := h.cfg.Client.Pending(r.Context())
	if err != nil {
		h.fail(w, "listing the permission requests", err)
		return
	}
	mine := slices.DeleteFunc(pending.Requests, func(p schemas.PermitRecord) bool { return p.AgentID != id })
	writeJSON(w, http.StatusOK, AgentPage{Role: roleName(principalOf(r.Context())), Record: rec, Pending: nonNil(mine)})
}

func (h *Handler) whoami(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"role": roleName(principalOf(r.Context())), "presets": presets()})
}

// presets are the permission presets an open takes, as the open request's
// own schema lists them: the Open form offers these and no others.
var presets = sync.OnceValue(func() []string {
	raw, err := fs.ReadFile(schemas.JSONSchemas, "jsonschema/control/open_request.json")
	if err != nil {
		panic("web: the open request's schema: " + err.Error())
	}
	var s struct {
		Properties struct {
			Permission struct {
				Enum []string `json:"enum"`
			} `json:"permission"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &s); err != nil || len(s.Properties.Permission.Enum) == 0 {
		panic(fmt.Sprintf("web: the open request's schema lists no presets (%v)", err))
	}
	return s.Properties.Permission.Enum
})

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// fail answers {"error":{code,message}} with the HTTP status the code
// stands for.
func (h *Handler) fail(w http.ResponseWriter, doing string, err error) {
	ce, ok := errors.AsType[*schemas.ControlError](err)
	if !ok {
		ce = &schemas.ControlError{Code: schemas.CodeInternal, Message: doing + ": " + err.Error()}
	}
	status := ce.Code.ServiceCode()
	if status == http.StatusInternalServerError {
		h.log.Warn("dashboard request failed", "doing", doing, "err", err)
	}
	writeJSON(w, status, schemas.ErrorReply{Error: ce})
}
