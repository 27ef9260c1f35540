package schemas

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Names of the JetStream assets every part of the fabric agrees on.
const (
	// StreamName is the stream that keeps every agent event.
	StreamName = "AGENTS"
	// EventSubjects is the subject filter of StreamName's events.
	EventSubjects = "agent.*"
	// BatchEndSubject is the other subject of StreamName: where a node
	// ends a fast batch of its events with a commit that stores nothing,
	// so that no watcher of agent.* sees a message that is no event.
	// Nothing is stored under it.
	BatchEndSubject = "shoal.batch.end"
	// AgentsBucket is the KV bucket of agent records, one key per agent id.
	AgentsBucket = "shoal_agents"
	// NodesBucket is the KV bucket of node capabilities and heartbeats.
	NodesBucket = "shoal_nodes"
)

// Headers carried by every event message. The payload is exactly the
// envelope; metadata travels here.
const (
	// HeaderMsgID is JetStream's dedupe header; its value is MsgID(id, n).
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderNode names the node that produced the event.
	HeaderNode = "Shoal-Node"
	// HeaderTime is the event's production time, RFC 3339 with nanoseconds, UTC.
	HeaderTime = "Shoal-Time"
	// HeaderClosedFor, on the events the coordinator (CloserName) stores
	// to close a lost node's agent, names that node: the turn it closes
	// ran there, and counts there.
	HeaderClosedFor = "Shoal-Closed-For"
	// HeaderAcked, on an event a confined node sends its relay (never
	// stored), is the agent's last event number the node has had
	// acknowledged as stored: every event of the agent up to it is
	// stored. The relay takes it for where the agent's numbering stands
	// when the stream holds none of the agent's current life (its events
	// aged out) and the relay was started since.
	HeaderAcked = "Shoal-Acked"
)

const idRule = "[a-z0-9][a-z0-9_-]{0,63}"

// ValidNodeName reports why name cannot be a node's, or nil when it can:
// a valid id (ValidID) that is not CloserName, the name the coordinator
// stores its closing of a lost node's agents under (a node of that name
// would have its turns read as such closings).
func ValidNodeName(name string) error {
	if err := ValidID(name); err != nil {
		return err
	}
	if name == CloserName {
		return fmt.Errorf("%q is the coordinator's name on the events it stores; give the node another", name)
	}
	return nil
}

// ValidID reports why id is not a valid agent id or node name, or nil when
// it is. Both must be single NATS subject tokens: 1 to 64 characters of
// lower-case letters, digits, '_' and '-', starting with a letter or digit.
func ValidID(id string) error {
	if id == "" {
		return fmt.Errorf("id is empty (want %s)", idRule)
	}
	if len(id) > 64 {
		return fmt.Errorf("id %.20q… is %d characters long (at most 64)", id, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			// The character whole (a byte of one read alone is another):
			// a byte of no character, as the byte.
			what := fmt.Sprintf("%q", id[i:i+1])
			if r, _ := utf8.DecodeRuneInString(id[i:]); r != utf8.RuneError {
				what = fmt.Sprintf("%q", r)
			}
			return fmt.Errorf("id %q has %s at position %d (want %s)", id, what, utf8.RuneCountInString(id[:i])+1, idRule)
		}
	}
	return nil
}

// ValidModel reports why model is no model name an agent may be opened
// with, or nil: a name is printable text of at most 256 bytes (it is a
// command-line argument of the agent's CLI, and a cell of every list).
func ValidModel(model string) error {
	if len(model) > 256 {
		return fmt.Errorf("model %.20q… is %d bytes long (at most 256)", model, len(model))
	}
	for i, r := range model {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError {
			return fmt.Errorf("model %q has %q at byte %d: a model name is printable text", model, r, i+1)
		}
	}
	return nil
}

// NewAgentID returns 8 random lower-case hex characters, Kaimon's default.
func NewAgentID() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("schemas: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// EventSubject is the subject of an agent's events: agent.<id>.
func EventSubject(id string) string { return "agent." + id }

// AgentFromSubject returns the agent id of an event subject.
func AgentFromSubject(subject string) (string, bool) {
	id, ok := strings.CutPrefix(subject, "agent.")
	if !ok || ValidID(id) != nil {
		return "", false
	}
	return id, true
}

// MsgID is an event's Nats-Msg-Id: the agent id and its gapless event
// number, counted from 1.
func MsgID(id string, n uint64) string { return id + "." + strconv.FormatUint(n, 10) }

// ParseMsgID splits a Nats-Msg-Id into agent id and event number.
func ParseMsgID(s string) (id string, n uint64, err error) {
	i := strings.LastIndexByte(s, '.')
	if i <= 0 {
		return "", 0, fmt.Errorf("message id %q is not <agent>.<n>", s)
	}
	id = s[:i]
	n, err = strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("message id %q has no event number", s)
	}
	if err := ValidID(id); err != nil {
		return "", 0, fmt.Errorf("message id %q: %w", s, err)
	}
	return id, n, nil
}

// ServiceName is the NATS micro service name every node registers, so
// `nats micro ls` lists the pool.
const ServiceName = "shoal-node"

// NodeConnName is the name a node gives its connections to the fabric in
// its life instance (NodeRecord.Instance; its events' connection adds
// " (events)"): the coordinator that takes the node for lost closes every
// connection of that life to its server, however lately made (a reconnect
// within its lease), so nothing the node sent before it was lost is read
// after its agents are closed; a new life's, under another instance, are
// left.
func NodeConnName(node, instance string) string { return "shoal node " + node + " " + instance }

// NewInstance is a fresh life instance of a node (NodeRecord.Instance).
func NewInstance() string {
	var id [8]byte
	rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// Verb names a control operation.
type Verb string

// The control verbs. A node answers those of NodeVerbs; the
// coordinator's fabric service those of FabricVerbs.
const (
	VerbOpen      Verb = "open"
	VerbSend      Verb = "send"
	VerbRun       Verb = "run"
	VerbOutput    Verb = "output"
	VerbStatus    Verb = "status"
	VerbList      Verb = "list"
	VerbInterrupt Verb = "interrupt"
	VerbClose     Verb = "close"
	VerbSetModel  Verb = "set_model"
	// VerbPermit answers a permission request an agent of the node waits on.
	VerbPermit Verb = "permit"
	// VerbDescribe answers the node's record as it stands: what it can
	// run (detected again every refresh), its labels, load and host.
	VerbDescribe Verb = "describe"
	// The verbs only the fabric service answers: a page of an agent's
	// events, the waiting permission requests, an agent's record as the
	// fabric keeps it, the nodes, and a streamed replay.
	VerbEvents  Verb = "events"
	VerbPending Verb = "pending"
	VerbRecord  Verb = "record"
	VerbNodes   Verb = "nodes"
	VerbReplay  Verb = "replay"
	// VerbBudget sets a budget (BudgetRequest); VerbBudgets reads every
	// budget and what the fleet spent (BudgetsReply).
	VerbBudget  Verb = "budget"
	VerbBudgets Verb = "budgets"
	// The verbs of agents on repositories (answered by nodes): whether
	// the node's cache holds a commit, an agent's diff, and a bundle of
	// its work.
	VerbRepoHas Verb = "repo_has"
	VerbDiff    Verb = "diff"
	VerbWork    Verb = "work"
)

// NodeVerbs lists the verbs a node answers under
// shoal.node.<node>.<verb>. (Output is read from the stream: the fabric
// service answers it, no node does.)
var NodeVerbs = []Verb{VerbOpen, VerbSend, VerbRun, VerbStatus, VerbList, VerbInterrupt, VerbClose, VerbSetModel, VerbPermit, VerbDescribe,
	VerbRepoHas, VerbDiff, VerbWork}

// FabricVerbs are the verbs of the coordinator's fabric service, each with
// the access it asks of the rights rules (Decide).
var FabricVerbs = map[Verb]Access{
	VerbEvents: AccessRead, VerbReplay: AccessRead, VerbStatus: AccessRead, VerbRecord: AccessRead,
	VerbList: AccessRead, VerbOutput: AccessRead, VerbPending: AccessRead, VerbNodes: AccessNodes,
	VerbOpen: AccessOpen, VerbSend: AccessAct, VerbRun: AccessAct, VerbInterrupt: AccessAct, VerbClose: AccessAct,
	VerbSetModel: AccessAct, VerbPermit: AccessAnswer, VerbBudget: AccessBudget, VerbBudgets: AccessRead,
	VerbDiff: AccessRead,
}

// NodeGroup is the subject prefix of a node's control endpoints.
func NodeGroup(node string) string { return "shoal.node." + node }

// ControlSubject is the subject where a node answers verb:
// shoal.node.<node>.<verb>.
func ControlSubject(node string, verb Verb) string { return NodeGroup(node) + "." + string(verb) }

// A confined node (one that runs with scoped credentials) never touches
// JetStream or another node's subjects. It reaches the fabric's state
// through the coordinator's relay, under shoal.relay.<node>, which checks
// that the node owns what it writes and forwards it.
const relayPrefix = "shoal.relay."

// RelayOp names what a confined node asks of the relay.
type RelayOp string

// The relay's operations. Event, record, get, permit and the bundles'
// carry an agent id as their last token; the rest take none.
const (
	// RelayEvent stores an event of an agent the node owns, numbered as
	// its next: forwarded to agent.<id>, and JetStream's acknowledgement
	// handed back to the node by the relay.
	RelayEvent RelayOp = "event"
	// RelayRecord writes an agent record with compare-and-set: forwarded
	// to the agent's key in AgentsBucket.
	RelayRecord RelayOp = "record"
	// RelayGet reads an agent record (any agent's: records are not secret).
	RelayGet RelayOp = "get"
	// RelayBeat writes or, with KV-Operation DEL, removes the node's own
	// entry in NodesBucket.
	RelayBeat RelayOp = "beat"
	// RelayOwned lists the records the node owns.
	RelayOwned RelayOp = "owned"
	// RelayLast reports the last stored event number of the node's agents.
	RelayLast RelayOp = "last"
	// RelayHello is a node's first word: is its name free, and how often
	// must it beat.
	RelayHello RelayOp = "hello"
	// RelayGrant asks for the node's current way to the coordinator's MCP
	// endpoint (a RelayGrantReply): a coordinator restarted since the
	// node's hello may serve it elsewhere, or under another token.
	RelayGrant RelayOp = "grant"
	// RelayPermit writes a permission request of an agent the node owns,
	// or its answer, to PermitsBucket.
	RelayPermit RelayOp = "permit"
	// RelayBundleGet reads a chunk of the bundle an agent the node was
	// given is opened from (its record's workspace names it), from
	// ReposBucket (RelayBundleRequest; the chunk, or an error, in the
	// reply).
	RelayBundleGet RelayOp = "bundle_get"
	// RelayBundlePut writes a chunk of a bundle of an agent's work, of the
	// agent's repository, to ReposBucket (headers HeaderBundle...).
	RelayBundlePut RelayOp = "bundle_put"
	// RelayBudget reads the budget of an agent the node owns, from
	// BudgetsBucket (a RelayEntry).
	RelayBudget RelayOp = "budget"
)

// The headers of the relay's bundle chunks.
const (
	// HeaderBundle names the bundle a chunk belongs to (bundle_put).
	HeaderBundle = "Shoal-Bundle"
	// HeaderBundleOffset is where in its bundle a chunk begins.
	HeaderBundleOffset = "Shoal-Bundle-Offset"
	// HeaderBundleLast marks a bundle's last chunk ("1").
	HeaderBundleLast = "Shoal-Bundle-Last"
	// HeaderBundleDescription describes a bundle written (bundle_put).
	HeaderBundleDescription = "Shoal-Bundle-Description"
	// HeaderRelayError marks a reply whose body is an ErrorReply, not a
	// chunk ("1").
	HeaderRelayError = "Shoal-Relay-Error"
	// BundleChunk is the most a chunk holds.
	BundleChunk = 512 << 10
)

// RelaySubject is where a confined node asks the relay for op:
// shoal.relay.<node>.<op>[.<agent>].
func RelaySubject(node string, op RelayOp, agent ...string) string {
	s := relayPrefix + node + "." + string(op)
	for _, a := range agent {
		s += "." + a
	}
	return s
}

// RelayNamespace matches everything a node may ask the relay:
// shoal.relay.<node>.>.
func RelayNamespace(node string) string { return relayPrefix + node + ".>" }

// RelayWildcard matches op from every node: shoal.relay.*.<op>[.*].
func RelayWildcard(op RelayOp) string {
	if RelayOpNamesAgent(op) {
		return relayPrefix + "*." + string(op) + ".*"
	}
	return relayPrefix + "*." + string(op)
}

// relayAgentOps are the relay's operations whose subjects end in an
// agent's id.
var relayAgentOps = []RelayOp{RelayEvent, RelayRecord, RelayGet, RelayPermit, RelayBundleGet, RelayBundlePut, RelayBudget}

// RelayOpNamesAgent reports whether op's subject ends in an agent's id.
func RelayOpNamesAgent(op RelayOp) bool { return slices.Contains(relayAgentOps, op) }

// RelayAgentOps names the operations whose subjects end in an agent's id,
// as a person reads a list ("a, b and c").
func RelayAgentOps() string {
	names := make([]string, len(relayAgentOps))
	for i, op := range relayAgentOps {
		names[i] = string(op)
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// RelaySubjectNode is the node a subject of the relay's namespace names
// (its first token after the prefix), whether or not the rest is well
// formed; "" for a subject outside the namespace.
func RelaySubjectNode(subject string) string {
	rest, ok := strings.CutPrefix(subject, relayPrefix)
	if !ok {
		return ""
	}
	node, _, _ := strings.Cut(rest, ".")
	return node
}

// ParseRelaySubject splits a relay subject into node, op and agent id.
func ParseRelaySubject(subject string) (node string, op RelayOp, agent string, ok bool) {
	rest, found := strings.CutPrefix(subject, relayPrefix)
	if !found {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) < 2 || ValidID(parts[0]) != nil {
		return "", "", "", false
	}
	node, op = parts[0], RelayOp(parts[1])
	if len(parts) == 3 {
		agent = parts[2]
		if ValidID(agent) != nil {
			return "", "", "", false
		}
	}
	return node, op, agent, true
}

// NodeReplyPrefix is where a node's replies go: the coordinator sends its
// requests to node with reply subjects under it, and only that node may
// publish there. (A leaf node cannot answer on the requester's own inbox:
// NATS does not carry replies from a leaf whose rights are restricted.)
func NodeReplyPrefix(node string) string { return "_INBOX.from-" + node }

// InboxPrefix is the inbox namespace of a credential: _INBOX.<role>-<name>.
// A confined connection only receives replies under its own prefix, and
// the relay only forwards a node's messages whose reply is under it.
func InboxPrefix(role, name string) string { return "_INBOX." + role + "-" + name }

// FabricReadVerbs are the verbs of the coordinator's fabric service that
// only read, sorted: all an observer may call (derived from FabricVerbs
// and Decide).
func FabricReadVerbs() []Verb {
	var out []Verb
	for v, a := range FabricVerbs {
		if Decide(Person(RoleObserver), a, Target{}).Allowed {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// MaxReplySubject bounds the reply subject of a request Shoal answers: a
// reply is published on it, sometimes with a reply of Shoal's own beside
// it, and a protocol line past the server's limit (4 KiB) closes the
// connection that sends it, which the service shares with every other
// request. Inboxes are far shorter; a request with a longer reply subject
// is dropped unanswered.
const MaxReplySubject = 512

// FabricPrefix is the subject prefix of the fabric service's verbs.
const FabricPrefix = "shoal.fabric"

// FabricService is the coordinator's NATS micro service, shoal-fabric:
// the whole fabric behind one door, for clients whose credentials reach
// neither the nodes nor the stream.
const FabricService = "shoal-fabric"

// FabricSubject is where the coordinator answers verb:
// shoal.fabric.<verb>.
func FabricSubject(verb Verb) string { return FabricPrefix + "." + string(verb) }

// Flow control of a streamed replay (shoal.fabric.replay): the
// coordinator asks the client to answer every ReplayAckEvery events and
// after ReplayIdle without one, and stops when an answer takes longer
// than ReplayAckWait. The client gives up when it hears nothing for
// ReplayLost.
//
// The client answers to a subject under ReplayAckPrefix: the only reply
// a client's or an observer's credentials may publish (they receive every
// agent's events, each with the reply subject of its publisher's
// acknowledgement, which an answer from them would forge).
const ReplayAckPrefix = "_INBOX.shoal-replay"

// RelayAckPrefix is where JetStream acknowledges the events the relay
// forwards, each under a token of its own. It is no inbox: every reader
// of agent.* sees it as the events' reply subject, and the fabric service
// answers any inbox a requester names, with the coordinator's rights; an
// answer there would be taken for the stream's acknowledgement.
const RelayAckPrefix = "shoal.relay-acks"

// BatchAckPrefix is where JetStream acknowledges a node's fast batches
// (each node's under a token of its own), no inbox for the same reason.
const BatchAckPrefix = "shoal.batch-acks"

const (
	ReplayAckEvery = 256
	ReplayIdle     = 5 * time.Second
	ReplayAckWait  = 30 * time.Second
	ReplayLost     = 3 * ReplayIdle
)
