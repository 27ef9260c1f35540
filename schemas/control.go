package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrorCode classifies a failed control request.
type ErrorCode string

// The error codes a control reply may carry.
const (
	CodeInvalid     ErrorCode = "invalid"     // the request is malformed or names something impossible
	CodeForbidden   ErrorCode = "forbidden"   // the rights rules refuse the caller this (schemas.Decide)
	CodeNotFound    ErrorCode = "not_found"   // no such agent or node
	CodeConflict    ErrorCode = "conflict"    // the id is taken, or a run is already in flight
	CodeUnavailable ErrorCode = "unavailable" // the owner is gone or not accepting work
	CodeTimeout     ErrorCode = "timeout"     // the operation did not finish in time
	CodeInternal    ErrorCode = "internal"    // a bug or an unexpected failure
)

// ServiceCode is the number a failed control reply carries in its
// Nats-Service-Error-Code header, the NATS micro convention of HTTP-like
// status codes: invalid 400, forbidden 403, not_found 404, conflict 409,
// internal 500, unavailable 503, timeout 504. An unknown code is 500.
func (c ErrorCode) ServiceCode() int {
	switch c {
	case CodeInvalid:
		return 400
	case CodeForbidden:
		return 403
	case CodeNotFound:
		return 404
	case CodeConflict:
		return 409
	case CodeUnavailable:
		return 503
	case CodeTimeout:
		return 504
	}
	return 500
}

// Headers of a failed reply of a NATS micro service (nats.go's
// micro.ErrorHeader and micro.ErrorCodeHeader): `nats micro stats`
// counts the replies that carry them. Shoal's error replies carry both
// beside the {"error":{"code","message"}} body, which stays the contract.
const (
	HeaderServiceError     = "Nats-Service-Error"
	HeaderServiceErrorCode = "Nats-Service-Error-Code"
)

// ServiceDescription is e's message as the Nats-Service-Error header
// carries it: on one line, at most 1 KiB (the body has all of it), and
// never empty.
func (e *ControlError) ServiceDescription() string {
	s := strings.Join(strings.Fields(e.Message), " ")
	if len(s) > 1024 {
		cut := 1024
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	if s == "" {
		s = string(e.Code)
	}
	if s == "" {
		s = string(CodeInternal)
	}
	return s
}

// ControlError is the error half of a control reply:
// {"error":{"code","message"}}.
type ControlError struct {
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
}

func (e *ControlError) Error() string { return e.Message }

// Errf returns a ControlError with a formatted message.
func Errf(code ErrorCode, format string, args ...any) *ControlError {
	return &ControlError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of a *ControlError in err's chain, or
// CodeInternal.
func CodeOf(err error) ErrorCode {
	if ce, ok := errors.AsType[*ControlError](err); ok {
		return ce.Code
	}
	return CodeInternal
}

// ErrorReply is the body of a failed control reply.
type ErrorReply struct {
	Error *ControlError `json:"error"`
}

// DecodeReply decodes a control reply into v, or returns its
// *ControlError when the reply is an error.
func DecodeReply(body []byte, v any) error {
	var probe struct {
		Error *ControlError `json:"error"`
	}
	if err := json.Unmarshal(body, &probe); err == nil && probe.Error != nil {
		return probe.Error
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode reply: %w", err)
	}
	return nil
}

// OpenRequest starts an agent (agent_open). Only CWD is required.
type OpenRequest struct {
	RequestID      string   `json:"request_id,omitempty"`
	CWD            string   `json:"cwd"`
	Model          string   `json:"model,omitempty"`
	Effort         string   `json:"effort,omitempty"`
	Permission     string   `json:"permission,omitempty"`
	PermissionMode string   `json:"permission_mode,omitempty"`
	AllowedTools   []string `json:"allowed_tools,omitempty"`
	Only           bool     `json:"only,omitempty"`
	// DisallowedTools nil means the recursion guard; an empty list lifts it.
	DisallowedTools *[]string `json:"disallowed_tools,omitempty"`
	MCPConfig       string    `json:"mcp_config,omitempty"`
	SystemPrompt    string    `json:"system_prompt,omitempty"`
	ID              string    `json:"id,omitempty"`
	// Node and Labels are fabric additions: where the agent may run.
	Node   string            `json:"node,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Sandbox asks for (true) or declines (false) the kernel sandbox;
	// unset, the node's --sandbox mode decides. SandboxNet names the
	// hosts a sandboxed agent may reach besides its model API.
	Sandbox    *bool    `json:"sandbox,omitempty"`
	SandboxNet []string `json:"sandbox_net,omitempty"`
	// SandboxKind asks for a sandbox at least this strong (and so for a
	// sandbox): SandboxNamespaces, or SandboxLandlock (Landlock and
	// seccomp alone, what every node that sandboxes gives).
	SandboxKind string `json:"sandbox_kind,omitempty"`
	// Ask puts what the preset neither allows nor denies to a person:
	// the agent waits for an answer (agent_permit) for up to AskTimeout
	// seconds (the node's default when 0), then is denied.
	Ask        bool    `json:"ask,omitempty"`
	AskTimeout float64 `json:"ask_timeout,omitempty"`
	// Parent and Depth are set by the MCP door when an agent opens an
	// agent: the calling agent, and how deep the child is (1 for an
	// agent's own child). No caller may set them.
	Parent string `json:"parent,omitempty"`
	Depth  int    `json:"depth,omitempty"`
	// Within is set by the MCP door when an agent opens an agent: its
	// parent's directory. The node that runs the child resolves the
	// child's directory and MCP config there, on its own filesystem,
	// and refuses them outside it (the coordinator may not see that
	// filesystem). A caller may set it only to narrow where the agent
	// works.
	Within string `json:"within,omitempty"`
	// Beneath is set by the MCP door when a sandboxed agent opens an
	// agent: the directory of its sandboxed family's first agent, which
	// no agent of the family can rename. The node opens the child's
	// directory from it through no symbolic link and makes the child's
	// sandbox from what it opened, so a parent that swaps the child's
	// directory for a link meanwhile gets no child outside. A caller may
	// set it only to narrow.
	Beneath string `json:"beneath,omitempty"`
	// Reach is what the agent may read and drive beyond its own subtree
	// (a Shoal addition): ReachOwn by default; only a person may grant
	// more, and a child never has more than its parent.
	Reach Reach `json:"reach,omitempty"`
	// Repo says CWD is a git repository of the caller's machine, on whose
	// own checkout the agent works (a Shoal addition, for MCP's
	// agent_open: shoal open --repo): the caller's client acts on it and
	// sends the node Workspace instead. Ref is what the agent starts on
	// (HEAD when empty); WithChanges starts it on the caller's
	// uncommitted work on top of HEAD.
	// BudgetTokens and BudgetUSD, when set, are what the agent's turns
	// may use in all (a Shoal addition): a turn that would start past
	// either is refused. Its budget is kept in BudgetsBucket.
	BudgetTokens int64   `json:"budget_tokens,omitempty"`
	BudgetUSD    float64 `json:"budget_usd,omitempty"`
	Repo         bool    `json:"repo,omitempty"`
	Ref          string  `json:"ref,omitempty"`
	WithChanges  bool    `json:"with_changes,omitempty"`
	// Workspace is set by Shoal's client for an open on a repository:
	// the checkout the node makes for the agent, which becomes its
	// working directory (CWD then names the caller's repository, for
	// people to read). No caller may set it.
	Workspace *Workspace `json:"workspace,omitempty"`
}

// OpenReply names the opened agent and the node that owns it.
type OpenReply struct {
	AgentID string `json:"agent_id"`
	Node    string `json:"node"`
}

// SendRequest writes a user turn (agent_send).
type SendRequest struct {
	RequestID string `json:"request_id,omitempty"`
	AgentID   string `json:"agent_id"`
	Text      string `json:"text"`
}

// SendReply carries the number of the turn the text started.
type SendReply struct {
	Turn int `json:"turn"`
}

// RunRequest sends a turn and waits for it to end (agent_run). Timeout is
// in seconds; zero means Kaimon's 600.
type RunRequest struct {
	RequestID string  `json:"request_id,omitempty"`
	AgentID   string  `json:"agent_id"`
	Text      string  `json:"text"`
	Timeout   float64 `json:"timeout,omitempty"`
}

// RunReply carries the turn's authoritative assistant text. Turn,
// StopReason and the truncation fields are fabric additions to Kaimon's
// {"text"}: the turn the run started and how it ended, and, for an answer
// too large for one message, how much of the text was cut (the text then
// ends with TruncationMarker).
type RunReply struct {
	Text         string     `json:"text"`
	Turn         int        `json:"turn,omitempty"`
	StopReason   StopReason `json:"stop_reason,omitempty"`
	Truncated    bool       `json:"truncated,omitempty"`
	DroppedBytes int        `json:"dropped_bytes,omitempty"`
	// NotBegun says why a turn that was held behind another never began
	// (an interrupt or a close dropped it); its stop reason is cancelled.
	NotBegun string `json:"not_begun,omitempty"`
}

// TruncationMarker is what Shoal puts where it cut text to fit a message
// (an event, a reply): "…[<n> bytes truncated by shoal: the message size
// limit]".
func TruncationMarker(n int) string {
	return fmt.Sprintf("…[%d bytes truncated by shoal: the message size limit]", n)
}

// Output selections for OutputRequest.Which.
const (
	WhichLastMessage = "last_message"
	WhichFullTurn    = "full_turn"
	WhichAll         = "all"
)

// OutputRequest reads an agent's output without blocking (agent_output).
type OutputRequest struct {
	AgentID      string `json:"agent_id"`
	Turn         *int   `json:"turn,omitempty"`
	Which        string `json:"which,omitempty"`
	IncludeTools bool   `json:"include_tools,omitempty"`
	MaxChars     *int   `json:"max_chars,omitempty"`
}

// OutputReply is agent_output's answer.
type OutputReply struct {
	AgentID      string      `json:"agent_id"`
	Turn         int         `json:"turn"`
	Status       AgentStatus `json:"status"`
	Done         bool        `json:"done"`
	Which        string      `json:"which"`
	Text         string      `json:"text"`
	Truncated    bool        `json:"truncated"`
	DroppedChars int         `json:"dropped_chars"`
	Usage        *Usage      `json:"usage,omitempty"`
}

// StatusRequest asks for an agent's record (agent_status).
type StatusRequest struct {
	AgentID string `json:"agent_id"`
}

// NodesRequest asks for the fabric's nodes (agent_nodes).
type NodesRequest struct{}

// AgentRequest names one agent: the body of status, interrupt and close.
type AgentRequest struct {
	RequestID string `json:"request_id,omitempty"`
	AgentID   string `json:"agent_id"`
}

// AgentRecord is an agent's status: Kaimon's agent_status fields plus the
// node that owns it. It is also the value of the agent's key in
// AgentsBucket.
type AgentRecord struct {
	ID            string      `json:"id"`
	Status        AgentStatus `json:"status"`
	Model         string      `json:"model"`
	CWD           string      `json:"cwd"`
	Turn          int         `json:"turn"`
	CreatedAt     float64     `json:"created_at"`
	LastActivity  float64     `json:"last_activity"`
	SessionID     string      `json:"session_id"`
	Transcript    *string     `json:"transcript"`
	EventLog      string      `json:"event_log"`
	Usage         Usage       `json:"usage"`
	QueuesPrompts bool        `json:"queues_prompts"`
	Node          string      `json:"node"`
	// UsageBefore is what the id's earlier lives used, carried from life
	// to life by the claim that reopens it (a Shoal addition): Usage is
	// this life's, as Kaimon's is its session's, and the agent's budget
	// covers both. Nil for an id's first life.
	UsageBefore *Usage `json:"usage_before,omitempty"`
	// Held is how many of the turns numbered (the last is Turn) have not
	// begun: they wait behind the running one. The turns up to Turn-Held
	// have begun. A Shoal addition, written before a send is answered.
	Held int `json:"held,omitempty"`
	// Running is what the running turn has used so far, as its backend
	// reported it and the node last wrote the record (a Shoal addition):
	// whoever closes the turn of an agent whose node is gone counts it,
	// in the turn's cancelled result and in Usage.
	Running *Usage `json:"running,omitempty"`
	// LastEvent is the number of the last event its node had numbered
	// when it wrote the record (a Shoal addition).
	LastEvent uint64 `json:"last_event,omitempty"`
	// ClosedBy names who wrote the record dead when its node did not: the
	// coordinator (CloserName), which took the node for lost (a Shoal
	// addition). A node restarting sends nothing more of a life another
	// closed.
	ClosedBy string `json:"closed_by,omitempty"`
	// Closing is what the coordinator keeps of a close it began until its
	// closing events are stored (a Shoal addition): should it stop between
	// writing the record dead and storing them, whoever sweeps next makes
	// the same events again and stores those missing (ClosingEvents).
	Closing *Closing `json:"closing,omitempty"`
	// EventsBefore and TurnsBefore are the last event and turn numbers
	// of the id's earlier lives, carried by the claim that reopens it as
	// UsageBefore is (a Shoal addition): a new life numbers after them,
	// and after its stream's end, so numbers the stream's retention
	// dropped are not handed out again.
	EventsBefore uint64 `json:"events_before,omitempty"`
	TurnsBefore  int    `json:"turns_before,omitempty"`
	// Policy is what the agent may call, for the MCP door; a Shoal addition.
	Policy *AgentPolicy `json:"policy,omitempty"`
	// Sandbox is what the kernel confines this life of the agent to; nil
	// when it runs unconfined.
	Sandbox *SandboxPolicy `json:"sandbox,omitempty"`
	// SandboxNet are the hosts its open let its sandbox reach besides the
	// model API and the MCP endpoint (the open's sandbox_net), as the
	// coordinator's side claimed it, which the node may not change: a
	// sandboxed agent's children reach no host beyond them. A Shoal
	// addition.
	SandboxNet []string `json:"sandbox_net,omitempty"`
	// Parent is the agent that opened this one through the MCP door, and
	// Depth how many such opens separate it from a caller that is no
	// agent; both empty for an agent a person or a program opened.
	Parent string `json:"parent,omitempty"`
	Depth  int    `json:"depth,omitempty"`
	// Reach is what the agent may read and drive beyond its own subtree;
	// empty is ReachOwn.
	Reach Reach `json:"reach,omitempty"`
	// RequestID is the id of the open request that made this life of the
	// agent, so a retried open recognises it.
	RequestID string `json:"request_id,omitempty"`
	// Workspace is the agent's own checkout of a caller's repository, when
	// it was opened on one (a Shoal addition): CWD is then that checkout.
	Workspace *Workspace `json:"workspace,omitempty"`
}

// Dead is the record of an agent whose node is gone, as whoever closes
// its stream writes it: dead, with what its running turn used so far
// (Running) counted in Usage, as the turn's closing result counts it.
func (r AgentRecord) Dead() AgentRecord {
	r.Status = StatusDead
	if r.Running != nil {
		r.Usage.Add(*r.Running)
		r.Running = nil
	}
	return r
}

// NextNumbers is where a new life of the id numbers on from, as far as
// this record of its last life says: its last event and turn. (An id
// whose record keeps a close not finished is not opened again until it
// is: Closing.)
func (r AgentRecord) NextNumbers() (events uint64, turns int) {
	// Held where numbering cannot wrap, whatever a record says.
	return min(max(r.EventsBefore, r.LastEvent), maxNumbering), min(max(r.TurnsBefore, r.Turn), maxNumbering)
}

// Closing is a close of an agent whose node is gone, as its record keeps
// it until the closing events are stored: enough to make them again.
type Closing struct {
	// From is the event number the closing events follow.
	From uint64 `json:"from"`
	// Tail is the stream's tail they were made from.
	Tail Tail `json:"tail"`
	// Why says what happened ("node mac was lost").
	Why string `json:"why"`
	// Status, Turn and Running are the record's before the close.
	Status  AgentStatus `json:"status"`
	Turn    int         `json:"turn,omitempty"`
	Running *Usage      `json:"running,omitempty"`
}

// CloseLost is the record that closes rec, an agent whose node is gone,
// as closer writes it, from its stream's tail: dead, numbered to the end
// of the closing events, and keeping the close (Closing) until they are
// stored.
func CloseLost(rec AgentRecord, tail Tail, why, closer string) AgentRecord {
	tail, n := tail.ClosingFrom(rec)
	events := tail.Closing(rec, why)
	dead := rec.Dead()
	dead.LastEvent, dead.Turn = n+uint64(len(events)), max(dead.Turn, tail.Turn)
	dead.ClosedBy = closer
	if len(events) > 0 {
		dead.Closing = &Closing{From: n, Tail: tail, Why: why, Status: rec.Status, Turn: rec.Turn, Running: rec.Running}
	}
	return dead
}

// ClosingEvents are the events that close the stream of the agent r
// closes (its Closing), and the number they follow: event i is numbered
// from+1+i. None when r keeps no close. A close that does not make the
// events its record numbers to (LastEvent), or more than MaxClosingEvents,
// is not one CloseLost wrote: an error says so, and nothing is made of it.
func (r AgentRecord) ClosingEvents() (from uint64, events []Event, err error) {
	c := r.Closing
	if c == nil {
		return 0, nil, nil
	}
	if len(c.Why) > maxClosingWhy {
		return 0, nil, fmt.Errorf("agent %s's record keeps a close whose reason is %d bytes, past %d", r.ID, len(c.Why), maxClosingWhy)
	}
	if c.From >= r.LastEvent || r.LastEvent-c.From > MaxClosingEvents {
		return 0, nil, fmt.Errorf("agent %s's record keeps a close of events %d to %d, not one of 1 to %d events", r.ID, c.From+1, r.LastEvent, MaxClosingEvents)
	}
	span := int(r.LastEvent - c.From)
	live := r
	live.Status, live.Turn, live.Running = c.Status, c.Turn, c.Running
	// A turn goes into at most three events, and one or two of them into
	// none: counted before any is made.
	if first, _, numbered := c.Tail.closingTurns(live); numbered-first > span {
		return 0, nil, fmt.Errorf("agent %s's record keeps a close of turns %d to %d in %d events", r.ID, first, numbered, span)
	}
	events = c.Tail.Closing(live, c.Why)
	if len(events) != span {
		return 0, nil, fmt.Errorf("agent %s's record keeps a close of %d events that makes %d", r.ID, span, len(events))
	}
	return c.From, events, nil
}

// MaxClosingEvents bounds the events a close kept in a record may make.
const MaxClosingEvents = 1 << 16

// maxClosingWhy bounds a kept close's reason, which each of its errors
// carries (the schema's bound).
const maxClosingWhy = 1024

// maxNumbering bounds the event and turn numbers a record may carry to a
// new life: far past any life's, and far from wrapping.
const maxNumbering = 1 << 52

// AllLives is what every life of the agent used, as far as its records
// kept it: this life's use and what the lives before it used.
func (r AgentRecord) AllLives() Usage {
	u := r.Usage
	if r.UsageBefore != nil {
		u.Add(*r.UsageBefore)
	}
	return u
}

// NextLife is what a life of the id after the one r records begins with
// as its earlier lives' use: r's, and what came before it.
func (r AgentRecord) NextLife() *Usage {
	u := r.AllLives()
	return &u
}

// AgentPolicy is the part of an agent's composed policy the MCP door
// judges its calls by.
type AgentPolicy struct {
	Preset          Preset   `json:"preset"`
	AllowedTools    []string `json:"allowed_tools"`
	DisallowedTools []string `json:"disallowed_tools"`
	Only            bool     `json:"only"`
	// Mode is the claude CLI permission mode the policy gives.
	Mode string `json:"mode,omitempty"`
	// CWD confines the paths the agent may pass to Shoal's tools.
	CWD string `json:"cwd"`
	// Ask says a person is asked what the preset neither allows nor
	// denies (a Shoal addition).
	Ask bool `json:"ask,omitempty"`
}

// ListRequest asks for every agent (agent_list). It has no fields.
type ListRequest struct{}

// FabricListRequest lists agents through the fabric service
// (shoal.fabric.list): with Paged, in pages, each within the fabric's
// message limit (ListPage); without it, whole, as a client of an earlier
// version asks for it (an error if it does not fit a message). MCP's
// agent_list and a node's list take no arguments (ListRequest).
type FabricListRequest struct {
	Paged bool `json:"paged,omitempty"`
	// After asks for the page of the records whose ids sort after it,
	// named by the last reply's Next.
	After string `json:"after,omitempty"`
}

// ListReply lists agent records, dead retained ones included.
type ListReply struct {
	Agents []AgentRecord `json:"agents"`
	// Next, in a paged reply of the fabric service, says the list goes
	// on: ask again with FabricListRequest.After set to it.
	Next string `json:"next,omitempty"`
}

// ListPage is the page of recs after the id after: the records whose ids
// sort after it, in the order of their ids, as many as fit within about
// maxBytes encoded (one at least), and Next when more follow.
func ListPage(recs []AgentRecord, after string, maxBytes int) ListReply {
	recs = slices.Clone(recs)
	slices.SortFunc(recs, func(a, b AgentRecord) int { return strings.Compare(a.ID, b.ID) })
	first, _ := slices.BinarySearchFunc(recs, after, func(r AgentRecord, id string) int {
		if r.ID <= id {
			return -1
		}
		return 1
	})
	rep := ListReply{Agents: []AgentRecord{}}
	size := 64
	for _, r := range recs[first:] {
		b, _ := json.Marshal(r)
		if len(rep.Agents) > 0 && size+len(b)+1 > maxBytes {
			rep.Next = rep.Agents[len(rep.Agents)-1].ID
			break
		}
		size += len(b) + 1
		rep.Agents = append(rep.Agents, r)
	}
	return rep
}

// InterruptReply says whether a cancel was delivered to the backend.
type InterruptReply struct {
	Interrupted bool `json:"interrupted"`
}

// CloseReply says whether a live agent was closed.
type CloseReply struct {
	Closed bool `json:"closed"`
}

// SetModelRequest repoints a live agent at another model (agent_set_model).
type SetModelRequest struct {
	RequestID string `json:"request_id,omitempty"`
	AgentID   string `json:"agent_id"`
	Model     string `json:"model"`
}

// SetModelReply says whether the agent switched.
type SetModelReply struct {
	Switched bool `json:"switched"`
	// Reason says why the agent did not switch (a Shoal addition).
	Reason string `json:"reason,omitempty"`
}

// EventsRequest reads a page of an agent's events from the stream
// (shoal.fabric.events, and the agent_events tool). At most one of
// FromEvent, FromTurn and Since; none reads from the start.
type EventsRequest struct {
	AgentID   string `json:"agent_id"`
	FromEvent uint64 `json:"from_event,omitempty"`
	FromTurn  int    `json:"from_turn,omitempty"`
	// Since is an RFC 3339 time: the first event stored at or after it.
	Since string `json:"since,omitempty"`
	// Max bounds the events returned; 200 when zero, at most 5000. A
	// page is cut short of it, with More, where its events would take
	// more than half a message of the fabric.
	Max int `json:"max,omitempty"`
	// IncludeDeltas keeps the streamed chunks, which only serve liveness.
	IncludeDeltas bool `json:"include_deltas,omitempty"`
}

// EventsReply is a page of events. NextEvent continues the read; More says
// whether more were stored when the page was cut.
type EventsReply struct {
	AgentID   string        `json:"agent_id"`
	Events    []StoredEvent `json:"events"`
	Gaps      []EventGap    `json:"gaps"`
	NextEvent uint64        `json:"next_event"`
	More      bool          `json:"more"`
	// Foreign names the messages on the agent's subject that are not its
	// events, which the page skipped: as many as a quarter of a message
	// holds, the rest counted in ForeignOmitted.
	Foreign        []ForeignMessage `json:"foreign,omitempty"`
	ForeignOmitted int              `json:"foreign_omitted,omitempty"`
}

// ForeignMessage is a message on an agent's subject that is not one of
// its events: where the stream holds it, the number it claims, and why it
// is not the agent's.
type ForeignMessage struct {
	Seq    uint64 `json:"seq"`
	N      uint64 `json:"n,omitempty"`
	Reason string `json:"reason"`
}

// StoredEvent is an event with what the stream knows of it.
type StoredEvent struct {
	N     uint64          `json:"n"`
	Time  string          `json:"time"`
	Node  string          `json:"node"`
	Event json.RawMessage `json:"event"`
}

// EventGap says events From through To of an agent are missing.
type EventGap struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

// NodesReply lists the nodes whose heartbeat is current (shoal.fabric.nodes).
type NodesReply struct {
	Nodes []NodeRecord `json:"nodes"`
	// Next, in a page, names the node the next page starts after.
	Next string `json:"next,omitempty"`
}

// FabricNodesRequest lists the nodes through the fabric service: whole
// (a client of an earlier version asks with nothing), or Paged, the page
// of the nodes whose names sort after After.
type FabricNodesRequest struct {
	Paged bool   `json:"paged,omitempty"`
	After string `json:"after,omitempty"`
}

// NodesPage is the page of nodes whose names sort after after, within
// maxBytes encoded (one node at least), by name.
func NodesPage(nodes []NodeRecord, after string, maxBytes int) NodesReply {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b NodeRecord) int { return strings.Compare(a.Name, b.Name) })
	rep := NodesReply{Nodes: []NodeRecord{}}
	size := 64
	for _, n := range nodes {
		if n.Name <= after {
			continue
		}
		b, _ := json.Marshal(n)
		if len(rep.Nodes) > 0 && size+len(b)+1 > maxBytes {
			rep.Next = rep.Nodes[len(rep.Nodes)-1].Name
			break
		}
		size += len(b) + 1
		rep.Nodes = append(rep.Nodes, n)
	}
	return rep
}

// ReplayRequest starts a replay the coordinator streams to the request's
// reply subject (shoal.fabric.replay), for clients that may not read the
// stream themselves. Agents empty means every agent. At most one of
// FromEvent, FromTurn, Since and New.
type ReplayRequest struct {
	Agents    []string `json:"agents,omitempty"`
	FromEvent uint64   `json:"from_event,omitempty"`
	FromTurn  int      `json:"from_turn,omitempty"`
	// Since is an RFC 3339 time: the first event stored at or after it.
	Since string `json:"since,omitempty"`
	// New starts with the next event published.
	New bool `json:"new,omitempty"`
	// Follow goes on with live events once the stored ones are sent.
	Follow bool `json:"follow,omitempty"`
}

// Headers of the messages of a streamed replay. An event message carries
// the event's own headers (HeaderMsgID, HeaderNode, HeaderTime) plus
// these; a control message carries only HeaderReplay.
const (
	// HeaderReplay marks a control message of a replay: "ack" asks the
	// client to answer (flow control and liveness), "end" ends it, "error"
	// ends it with an ErrorReply as the body.
	HeaderReplay = "Shoal-Replay"
	// HeaderRelayBusy marks the relay's answer to an operation of a
	// confined node that the node's share of the relay's work had no room
	// for (its value is the share's size): nothing was done, and the node
	// sends it again after a moment.
	HeaderRelayBusy = "Shoal-Relay-Busy"
	// HeaderKeepalive on a request of the fabric service asks the
	// coordinator holding it to say so every so many milliseconds (its
	// value) until it answers: each such word is a message to the reply
	// subject with this header and no body, not the answer. A client that
	// hears none for a while takes the coordinator for gone and sends the
	// request again (a Shoal addition; asked only by Shoal's own client).
	HeaderKeepalive = "Shoal-Keepalive"
	// HeaderSeq is the event's stream sequence.
	HeaderSeq = "Shoal-Seq"
	// HeaderStored is when the stream stored the event, RFC 3339 UTC.
	HeaderStored = "Shoal-Stored"
	// HeaderGap says events were missing before this one: "<from>-<to>".
	HeaderGap = "Shoal-Gap"
	// HeaderStray marks a message on an agent's subject that is not one
	// of its events, and says why; HeaderAgent names the agent.
	HeaderStray = "Shoal-Stray"
	HeaderAgent = "Shoal-Agent"
)

// Agent names the agent a request is about, for the rights rules.
func (r SendRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r RunRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r OutputRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r StatusRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r AgentRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r SetModelRequest) Agent() string { return r.AgentID }

// Agent names the agent a request is about.
func (r EventsRequest) Agent() string { return r.AgentID }

// Agent is the agent the request is about.
func (r DiffRequest) Agent() string { return r.AgentID }

// Agent is the agent the request is about.
func (r FetchRequest) Agent() string { return r.AgentID }
