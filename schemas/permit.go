package schemas

import (
	"encoding/json"
	"fmt"
	"strings"
)

// PermitsBucket is the KV bucket of the permission requests agents wait
// on, keyed <agent id>.<request id>: an open request has no answer; an
// answered one keeps its answer until its agent's next life.
const PermitsBucket = "shoal_permits"

// PermitKey is a permission request's key in PermitsBucket.
func PermitKey(agent, request string) string { return agent + "." + request }

// ParseDecision reads allow or deny, in any case.
func ParseDecision(s string) (Decision, error) {
	switch d := Decision(strings.ToLower(strings.TrimSpace(s))); d {
	case DecisionAllow, DecisionDeny:
		return d, nil
	}
	return "", fmt.Errorf("decision %q: want allow or deny", s)
}

// Decision is a person's answer to a permission request.
type Decision string

const (
	DecisionAllow Decision = "allow"
	DecisionDeny  Decision = "deny"
)

// PermitRecord is one permission request an agent is waiting on (no
// Answer yet), or the answer it got.
type PermitRecord struct {
	AgentID   string `json:"agent_id"`
	RequestID string `json:"request_id"`
	Node      string `json:"node"`
	// Tool is the tool's name; ToolCallID the call's id on the stream.
	Tool       string `json:"tool"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Input is the tool's input as the agent gave it.
	Input       json.RawMessage `json:"input,omitempty"`
	Description string          `json:"description,omitempty"`
	// Options are the agent's own choices (allow once, allow always,
	// reject), when it offers them.
	Options  []PermissionOption `json:"options"`
	AskedAt  float64            `json:"asked_at"`
	Deadline float64            `json:"deadline,omitempty"`
	Answer   *PermitAnswer      `json:"answer,omitempty"`
}

// PermitAnswer is how a permission request was answered, and by whom: a
// person ("mcp", "cli:<user>", "tui"), or the node ("deadline", "closed",
// "node restarted").
type PermitAnswer struct {
	Decision Decision `json:"decision"`
	Option   string   `json:"option,omitempty"`
	Message  string   `json:"message,omitempty"`
	// Input is the tool's input as the person allowed it, when they
	// changed it.
	Input json.RawMessage `json:"input,omitempty"`
	By    string          `json:"by"`
	At    float64         `json:"at"`
}

// PermitRequest answers a permission request (agent_permit, shoal permit).
// Option picks one of the request's options; Message goes back to the
// agent with a denial.
type PermitRequest struct {
	AgentID   string   `json:"agent_id"`
	RequestID string   `json:"request_id"`
	Decision  Decision `json:"decision"`
	Option    string   `json:"option,omitempty"`
	Message   string   `json:"message,omitempty"`
	// Input replaces the tool's input with an allow (claude agents).
	Input json.RawMessage `json:"input,omitempty"`
	// By names the answerer; the fabric sets it from who asks.
	By string `json:"by,omitempty"`
}

// PermitReply is the request as answered.
type PermitReply struct {
	Record PermitRecord `json:"record"`
}

// PendingReply lists the permission requests still waiting for an answer.
type PendingReply struct {
	Requests []PermitRecord `json:"requests"`
}

// Agent names the agent a request is about, for the rights rules.
func (r PermitRequest) Agent() string { return r.AgentID }
