package schemas

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
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
	// Omitted counts the requests waiting beyond those listed, when the
	// list would not fit in one reply (PendingWithin).
	Omitted int `json:"omitted,omitempty"`
}

// Bounds of permission requests: what a real one needs is the tool's
// name and its input, and a person reads every one of them.
const (
	// MaxPermitBytes is the most an encoded PermitRecord holds; the relay
	// refuses a larger one, and a node cuts a request's input and
	// description short to fit (FitPermit).
	MaxPermitBytes = 1 << 20
	// MaxPendingPerAgent is the most requests of one agent waiting at once
	// in PermitsBucket; the relay refuses another until one is answered.
	MaxPendingPerAgent = 16
	// MaxListedInput is the most of a request's input a list of what
	// waits shows; past it, a marker (ListedInput).
	MaxListedInput = 16 << 10
	// maxListedDescription is the most of a description a list shows.
	maxListedDescription = 4 << 10
	// maxListedTool is the most of a tool's name a request keeps (an ACP
	// agent's title may carry its command).
	maxListedTool = 1 << 10
	// maxListedOptions is the most options a request keeps; an agent
	// offers a handful.
	maxListedOptions = 16
	// MaxAnsweredPermits is the most answered requests of one agent
	// PermitsBucket keeps, as its node's own book does: past it the relay
	// removes the agent's oldest answered ones as new requests come. With
	// MaxPendingPerAgent waiting and each answered one small (Answered), an
	// agent's room in the bucket is bounded, and so a node's by the
	// agents opens gave it, whatever it writes.
	MaxAnsweredPermits = 512
	// maxAnsweredInput is the most of an input an answered record keeps;
	// the agent's stream holds the request and its answer whole.
	maxAnsweredInput = 2 << 10
)

// Answered is the request rec, as PermitsBucket has it, answered by ans:
// its inputs, description and the answer's words cut short (the record is
// for the lists and for naming who answered; the agent's stream holds
// both whole), so that an answer never makes a record larger than a
// small one, whatever the request was.
func Answered(rec PermitRecord, ans PermitAnswer) PermitRecord {
	rec.Tool, rec.ToolCallID = cut(rec.Tool, MaxLabelBytes), cut(rec.ToolCallID, MaxLabelBytes)
	opts := make([]PermissionOption, 0, min(len(rec.Options), 8))
	for _, o := range rec.Options[:min(len(rec.Options), 8)] {
		opts = append(opts, PermissionOption{OptionID: cut(o.OptionID, MaxLabelBytes), Name: cut(o.Name, MaxLabelBytes), Kind: PermissionKind(cut(string(o.Kind), MaxLabelBytes))})
	}
	rec.Options = opts
	rec.Input = ListedInput(rec.Input, maxAnsweredInput)
	rec.Description = cut(rec.Description, maxAnsweredInput/2)
	ans.Input = ListedInput(ans.Input, maxAnsweredInput)
	ans.Message = cut(ans.Message, maxAnsweredInput/2)
	ans.Option, ans.By = cut(ans.Option, MaxLabelBytes), cut(ans.By, MaxLabelBytes)
	rec.Answer = &ans
	return rec
}

// boundLabels is rec with its tool's name, and its options, held to what
// a list shows: a node could otherwise make one request as large as a
// whole list and crowd out every other agent's. An option's id is kept
// whole or the option left out (a cut id would name no option its node
// takes); the node still takes any of its agent's options by id.
func boundLabels(rec PermitRecord) PermitRecord {
	rec.Tool = cut(rec.Tool, maxListedTool)
	if len(rec.ToolCallID) > MaxLabelBytes {
		rec.ToolCallID = "" // an id cut short would match nothing
	}
	if len(rec.Options) > maxListedOptions || slices.ContainsFunc(rec.Options, func(o PermissionOption) bool {
		return len(o.OptionID) > MaxLabelBytes || len(o.Name) > MaxLabelBytes || len(o.Kind) > MaxLabelBytes
	}) {
		opts := make([]PermissionOption, 0, min(len(rec.Options), maxListedOptions))
		for _, o := range rec.Options {
			if len(opts) == maxListedOptions {
				break
			}
			if len(o.OptionID) <= MaxLabelBytes {
				opts = append(opts, PermissionOption{OptionID: o.OptionID, Name: cut(o.Name, MaxLabelBytes), Kind: PermissionKind(cut(string(o.Kind), MaxLabelBytes))})
			}
		}
		rec.Options = opts
	}
	return rec
}

// ListedInput is in as a list of requests shows it: in itself when it is
// at most max bytes, else a marker, {"shoal_truncated": {"bytes": N,
// "head": "…"}}, holding the first part of it as text.
func ListedInput(in json.RawMessage, max int) json.RawMessage {
	if len(in) <= max {
		return in
	}
	head := string(in[:max/2])
	for !utf8.ValidString(head) && len(head) > 0 {
		head = head[:len(head)-1]
	}
	b, _ := json.Marshal(map[string]any{"shoal_truncated": map[string]any{"bytes": len(in), "head": head}})
	return b
}

// cut is s cut short to at most max bytes, on a rune's boundary, with a
// mark when it was.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for !utf8.ValidString(s) && len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s + "… (cut short)"
}

// FitPermit is rec held to MaxPermitBytes: its tool's name and its
// options held to what a list shows, its input and description (and an
// answer's input) cut short with a marker when the whole would be
// larger.
func FitPermit(rec PermitRecord) PermitRecord {
	rec = boundLabels(rec)
	fits := func(r PermitRecord) bool {
		b, err := json.Marshal(r)
		return err == nil && len(b) <= MaxPermitBytes
	}
	if fits(rec) {
		return rec
	}
	var out PermitRecord
	// Escaped, a part may take several times its bytes: smaller again if
	// the first cut is not enough.
	for _, max := range []int{MaxPermitBytes / 4, MaxListedInput} {
		out = rec
		out.Input = ListedInput(rec.Input, max)
		out.Description = cut(rec.Description, max/2)
		if rec.Answer != nil {
			a := *rec.Answer
			a.Input = ListedInput(a.Input, max)
			a.Message = cut(a.Message, max/2)
			out.Answer = &a
		}
		if fits(out) {
			break
		}
	}
	return out
}

// PendingWithin lists reqs (oldest first) within about maxBytes encoded:
// each input and description as a list shows it (ListedInput), and, when
// even so they would not fit, each agent's oldest first, one agent after
// another, so one agent's requests cannot hide another's; what is left
// out is counted in Omitted.
func PendingWithin(reqs []PermitRecord, maxBytes int) PendingReply {
	type ranked struct {
		rec  PermitRecord
		rank int // its place among its agent's
	}
	seen := map[string]int{}
	all := make([]ranked, 0, len(reqs))
	for _, r := range reqs {
		r = boundLabels(r)
		r.Input = ListedInput(r.Input, MaxListedInput)
		r.Description = cut(r.Description, maxListedDescription)
		all = append(all, ranked{r, seen[r.AgentID]})
		seen[r.AgentID]++
	}
	slices.SortStableFunc(all, func(a, b ranked) int { return a.rank - b.rank })
	rep := PendingReply{Requests: []PermitRecord{}}
	size := 64
	for i, r := range all {
		b, _ := json.Marshal(r.rec)
		if size+len(b)+1 > maxBytes {
			rep.Omitted = len(all) - i
			break
		}
		size += len(b) + 1
		rep.Requests = append(rep.Requests, r.rec)
	}
	slices.SortStableFunc(rep.Requests, ByAsked)
	return rep
}

// ByAsked orders permission requests by when they were asked, oldest
// first (a sort's comparison).
func ByAsked(a, b PermitRecord) int { return cmp.Compare(a.AskedAt, b.AskedAt) }

// Agent names the agent a request is about, for the rights rules.
func (r PermitRequest) Agent() string { return r.AgentID }
