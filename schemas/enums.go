package schemas

import (
	"encoding/json"
	"strings"
)

// ToolKind classifies a tool call. Unknown values become ToolOther.
type ToolKind string

// The tool kinds of Kaimon's update model.
const (
	ToolRead       ToolKind = "read"
	ToolEdit       ToolKind = "edit"
	ToolDelete     ToolKind = "delete"
	ToolMove       ToolKind = "move"
	ToolSearch     ToolKind = "search"
	ToolExecute    ToolKind = "execute"
	ToolThink      ToolKind = "think"
	ToolFetch      ToolKind = "fetch"
	ToolSwitchMode ToolKind = "switch_mode"
	ToolOther      ToolKind = "other"
)

// ParseToolKind coerces s to a ToolKind, falling back to ToolOther.
func ParseToolKind(s string) ToolKind {
	switch k := ToolKind(s); k {
	case ToolRead, ToolEdit, ToolDelete, ToolMove, ToolSearch, ToolExecute,
		ToolThink, ToolFetch, ToolSwitchMode, ToolOther:
		return k
	}
	return ToolOther
}

// ToolKindForName derives a tool kind from a tool's name the way Kaimon's
// claude backend does: lower-cased, first match wins.
func ToolKindForName(name string) ToolKind {
	n := strings.ToLower(name)
	switch {
	case strings.Contains(n, "read"):
		return ToolRead
	case n == "edit" || n == "write" || n == "multiedit" || n == "notebookedit":
		return ToolEdit
	case strings.Contains(n, "bash") || strings.Contains(n, "exec"):
		return ToolExecute
	case n == "grep" || n == "glob" || strings.Contains(n, "search"):
		return ToolSearch
	case strings.Contains(n, "fetch") || strings.Contains(n, "websearch"):
		return ToolFetch
	case n == "todowrite":
		return ToolThink
	}
	return ToolOther
}

// UnmarshalJSON coerces unknown kinds to ToolOther.
func (k *ToolKind) UnmarshalJSON(b []byte) error {
	return coerce(b, k, ParseToolKind)
}

// ToolStatus is a tool call's progress. Unknown values become ToolPending.
type ToolStatus string

// The tool call statuses.
const (
	ToolPending    ToolStatus = "pending"
	ToolInProgress ToolStatus = "in_progress"
	ToolCompleted  ToolStatus = "completed"
	ToolFailed     ToolStatus = "failed"
)

// ParseToolStatus coerces s to a ToolStatus, falling back to ToolPending.
func ParseToolStatus(s string) ToolStatus {
	switch st := ToolStatus(s); st {
	case ToolPending, ToolInProgress, ToolCompleted, ToolFailed:
		return st
	}
	return ToolPending
}

// UnmarshalJSON coerces unknown statuses to ToolPending.
func (s *ToolStatus) UnmarshalJSON(b []byte) error {
	return coerce(b, s, ParseToolStatus)
}

// StopReason says why a turn ended. Unknown values become StopEndTurn.
type StopReason string

// The stop reasons.
const (
	StopEndTurn         StopReason = "end_turn"
	StopMaxTokens       StopReason = "max_tokens"
	StopMaxTurnRequests StopReason = "max_turn_requests"
	StopRefusal         StopReason = "refusal"
	StopCancelled       StopReason = "cancelled"
)

// ParseStopReason coerces s to a StopReason, falling back to StopEndTurn.
func ParseStopReason(s string) StopReason {
	switch r := StopReason(s); r {
	case StopEndTurn, StopMaxTokens, StopMaxTurnRequests, StopRefusal, StopCancelled:
		return r
	}
	return StopEndTurn
}

// UnmarshalJSON coerces unknown reasons to StopEndTurn.
func (r *StopReason) UnmarshalJSON(b []byte) error {
	return coerce(b, r, ParseStopReason)
}

// PermissionKind is the kind of an answer a permission request offers.
// Unknown values become PermissionAllowOnce.
type PermissionKind string

// The permission option kinds.
const (
	PermissionAllowOnce    PermissionKind = "allow_once"
	PermissionAllowAlways  PermissionKind = "allow_always"
	PermissionRejectOnce   PermissionKind = "reject_once"
	PermissionRejectAlways PermissionKind = "reject_always"
)

// ParsePermissionKind coerces s, falling back to PermissionAllowOnce.
func ParsePermissionKind(s string) PermissionKind {
	switch k := PermissionKind(s); k {
	case PermissionAllowOnce, PermissionAllowAlways, PermissionRejectOnce, PermissionRejectAlways:
		return k
	}
	return PermissionAllowOnce
}

// UnmarshalJSON coerces unknown kinds to PermissionAllowOnce.
func (k *PermissionKind) UnmarshalJSON(b []byte) error {
	return coerce(b, k, ParsePermissionKind)
}

// PlanPriority is a plan entry's priority. Unknown values become PriorityMedium.
type PlanPriority string

// The plan priorities.
const (
	PriorityHigh   PlanPriority = "high"
	PriorityMedium PlanPriority = "medium"
	PriorityLow    PlanPriority = "low"
)

// ParsePlanPriority coerces s, falling back to PriorityMedium.
func ParsePlanPriority(s string) PlanPriority {
	switch p := PlanPriority(s); p {
	case PriorityHigh, PriorityMedium, PriorityLow:
		return p
	}
	return PriorityMedium
}

// UnmarshalJSON coerces unknown priorities to PriorityMedium.
func (p *PlanPriority) UnmarshalJSON(b []byte) error {
	return coerce(b, p, ParsePlanPriority)
}

// PlanStatus is a plan entry's progress. Unknown values become PlanPending.
type PlanStatus string

// The plan entry statuses.
const (
	PlanPending    PlanStatus = "pending"
	PlanInProgress PlanStatus = "in_progress"
	PlanCompleted  PlanStatus = "completed"
)

// ParsePlanStatus coerces s, falling back to PlanPending.
func ParsePlanStatus(s string) PlanStatus {
	switch st := PlanStatus(s); st {
	case PlanPending, PlanInProgress, PlanCompleted:
		return st
	}
	return PlanPending
}

// UnmarshalJSON coerces unknown statuses to PlanPending.
func (s *PlanStatus) UnmarshalJSON(b []byte) error {
	return coerce(b, s, ParsePlanStatus)
}

// AgentStatus is an agent's lifecycle state, as carried by status events
// and agent records. Closed appears only as an event: the synthetic marker
// published when agent_close reaches a live agent.
type AgentStatus string

// The agent statuses.
const (
	StatusStarting AgentStatus = "starting"
	StatusIdle     AgentStatus = "idle"
	StatusWorking  AgentStatus = "working"
	StatusDead     AgentStatus = "dead"
	StatusClosed   AgentStatus = "closed"
)

// Valid reports whether s is one of the agent statuses.
func (s AgentStatus) Valid() bool {
	switch s {
	case StatusStarting, StatusIdle, StatusWorking, StatusDead, StatusClosed:
		return true
	}
	return false
}

// Published reports whether a status event may carry s: every status but
// starting, which only an agent's record holds (Kaimon never publishes it).
func (s AgentStatus) Published() bool { return s != StatusStarting && s.Valid() }

// coerce decodes a JSON string (or null, as the empty string) and maps it
// through parse, so an unknown enum value takes its fallback.
func coerce[T ~string](b []byte, dst *T, parse func(string) T) error {
	var s string
	if string(b) != "null" {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	*dst = parse(s)
	return nil
}
