package schemas

import (
	"fmt"
	"slices"
	"strings"
)

// Rights: who may do what to which agent, decided in one place. Every
// surface (the MCP door, the dashboard and its event stream, the fabric
// service, the relay, permission answers, reads) names the principal that
// makes a request, what it asks to do and how the target agent stands to
// it, and asks Decide.

// PrincipalKind says what makes a request.
type PrincipalKind string

// The kinds of principal.
const (
	// KindPerson is someone with a token or credentials: an MCP token, a
	// loopback endpoint without one, or NATS credentials of a role.
	KindPerson PrincipalKind = "person"
	// KindAgent is an agent Shoal started, known by the identity its node
	// or its proxy gives its requests, never by what it says of itself.
	KindAgent PrincipalKind = "agent"
	// KindNode is an agent host, known by its credentials.
	KindNode PrincipalKind = "node"
)

// Role is what a person may do.
type Role string

// The roles of a person.
const (
	// RoleFull may do everything: the full MCP token, a loopback endpoint
	// with no token, client or coordinator credentials.
	RoleFull Role = "full"
	// RoleObserver may only watch: the observer token, observer
	// credentials.
	RoleObserver Role = "observer"
)

// Reach is how far beyond its own subtree an agent may go; a person grants
// it when opening the agent, and an agent's child never has more than its
// parent.
type Reach string

// The reaches an agent can be given.
const (
	// ReachOwn, the default, is the agent's own subtree: the agents it
	// opened, and theirs.
	ReachOwn Reach = "own"
	// ReachRead adds reading every agent of the fabric.
	ReachRead Reach = "read"
	// ReachAll reads and drives every agent, as a person with the full
	// token would (its tool policy and sandbox still bind it).
	ReachAll Reach = "all"
)

// Reaches lists the reaches, narrowest first.
var Reaches = []Reach{ReachOwn, ReachRead, ReachAll}

// ParseReach reads a reach; "" is ReachOwn.
func ParseReach(s string) (Reach, error) {
	r := Reach(strings.ToLower(strings.TrimSpace(s)))
	if r == "" {
		return ReachOwn, nil
	}
	if !slices.Contains(Reaches, r) {
		return "", fmt.Errorf("unknown reach %q (want own, read or all)", s)
	}
	return r, nil
}

// Wider reports whether r reaches further than o.
func (r Reach) Wider(o Reach) bool {
	return slices.Index(Reaches, r.orOwn()) > slices.Index(Reaches, o.orOwn())
}

// String is the reach, "own" when unset.
func (r Reach) String() string { return string(r.orOwn()) }

func (r Reach) orOwn() Reach {
	if r == "" {
		return ReachOwn
	}
	return r
}

// Principal is who makes a request.
type Principal struct {
	Kind PrincipalKind
	// Role is a person's.
	Role Role
	// Agent is an agent's id, Reach what it was granted, Sandboxed whether
	// it runs in the kernel sandbox; Confined how tightly (see Laxer).
	Agent     string
	Reach     Reach
	Sandboxed bool
	Confined  Confined
	// Node is a node's name.
	Node string
}

// Person is a person of role r.
func Person(r Role) Principal { return Principal{Kind: KindPerson, Role: r} }

// AgentPrincipal is the agent rec as a principal.
func AgentPrincipal(rec AgentRecord) Principal {
	return Principal{Kind: KindAgent, Agent: rec.ID, Reach: rec.Reach.orOwn(), Sandboxed: rec.Sandbox != nil, Confined: ConfinedOf(rec)}
}

// Confined is how tightly a sandboxed agent is held, as far as one agent
// driving another may widen it: whether it has namespaces of its own (or
// Landlock alone), and the hosts its open added (sandbox_net).
type Confined struct {
	Namespaces bool
	Net        []string
}

// ConfinedOf is how tightly rec's agent is held (nothing of it when it
// is not sandboxed).
func ConfinedOf(rec AgentRecord) Confined {
	if rec.Sandbox == nil {
		return Confined{}
	}
	return Confined{Namespaces: SandboxGives(rec.Sandbox.Kernel, SandboxNamespaces), Net: rec.SandboxNet}
}

// Laxer reports whether an agent held as c may do what one held as than
// may not: Landlock alone where than has namespaces, or a host than may
// not reach.
func (c Confined) Laxer(than Confined) bool {
	if than.Namespaces && !c.Namespaces {
		return true
	}
	for _, h := range c.Net {
		if !NetAllows(than.Net, h) {
			return true
		}
	}
	return false
}

// NodePrincipal is node name as a principal.
func NodePrincipal(name string) Principal { return Principal{Kind: KindNode, Node: name} }

// String names the principal as a refusal does.
func (p Principal) String() string {
	switch p.Kind {
	case KindAgent:
		if p.Agent == "" {
			return "an agent"
		}
		return "agent " + p.Agent
	case KindNode:
		return "node " + p.Node
	case KindPerson:
		if p.Role == RoleObserver {
			return "an observer"
		}
		return "a person"
	}
	return "nobody"
}

// Access is what a principal asks to do.
type Access string

// The accesses Decide rules on.
const (
	// AccessRead reads an agent: its record, stream, output, events and
	// the permission requests it waits on.
	AccessRead Access = "read"
	// AccessAct drives an agent: send, run, interrupt, close, set_model.
	AccessAct Access = "act"
	// AccessAnswer answers a permission request an agent waits on.
	AccessAnswer Access = "answer"
	// AccessOpen opens an agent (an agent's child: its policy is judged by
	// Policy.Admits besides).
	AccessOpen Access = "open"
	// AccessNodes lists the fabric's nodes, which names machines, not
	// agents.
	AccessNodes Access = "nodes"
	// AccessSideDoor uses the dashboard, its API and event stream, or the
	// metrics.
	AccessSideDoor Access = "side_door"
	// AccessStore stores an event, a record or a permission request of an
	// agent (a node, through the relay).
	AccessStore Access = "store"
	// AccessFiles reads or writes files of the machine that serves the
	// call: an open on one of its repositories (agent_open with repo), a
	// fetch of an agent's work into one (agent_fetch).
	AccessFiles Access = "files"
	// AccessBudget sets what agents, the fleet and a label's nodes may
	// spend (shoal budget set).
	AccessBudget Access = "budget"
)

// Accesses lists every access, for tables.
var Accesses = []Access{AccessRead, AccessAct, AccessAnswer, AccessOpen, AccessNodes, AccessSideDoor, AccessStore, AccessFiles, AccessBudget}

// Relation is how a target agent stands to an agent principal.
type Relation string

// The relations, from the principal's side.
const (
	RelNone       Relation = ""           // no target agent, or a principal that is no agent
	RelSelf       Relation = "self"       // the principal itself
	RelChild      Relation = "child"      // an agent it opened
	RelDescendant Relation = "descendant" // an agent its children opened, or theirs
	RelParent     Relation = "parent"     // the agent that opened it
	RelAncestor   Relation = "ancestor"   // above its parent
	RelSibling    Relation = "sibling"    // opened by its parent
	RelRelative   Relation = "relative"   // elsewhere in the tree it belongs to
	RelUnrelated  Relation = "unrelated"  // in another tree: another client's, or no agent's
)

// Relations lists every relation an agent target can have, for tables.
var Relations = []Relation{RelSelf, RelChild, RelDescendant, RelParent, RelAncestor, RelSibling, RelRelative, RelUnrelated}

// inSubtree reports whether r lies in the principal's own subtree, itself
// excluded.
func (r Relation) inSubtree() bool { return r == RelChild || r == RelDescendant }

// Target is what Decide knows of the agent a request is about.
type Target struct {
	// Agent is its id; "" when the request is about no agent.
	Agent string
	// Rel is how it stands to an agent principal (Relate).
	Rel Relation
	// Owner is the node that owns it.
	Owner string
	// Ended says its stream is closed: its last life ended with a dead
	// status, and nothing more may be stored for it until it is reopened.
	Ended bool
	// Sandboxed says it runs in the kernel sandbox; Confined how tightly.
	Sandboxed bool
	Confined  Confined
}

// Rule names why Decide answered as it did.
type Rule string

// The rules.
const (
	RuleAllowed    Rule = "allowed"
	RuleObserver   Rule = "observer"
	RuleSubtree    Rule = "subtree"
	RuleSelf       Rule = "self"
	RuleOwnAsk     Rule = "own-requests"
	RuleSandboxed  Rule = "sandboxed"
	RuleLaxer      Rule = "laxer-sandbox"
	RuleSideDoors  Rule = "side-doors"
	RuleOwner      Rule = "owner"
	RuleEnded      Rule = "ended"
	RuleNodesOnly  Rule = "nodes-store"
	RulePeopleOnly Rule = "people-and-agents"
	RuleFiles      Rule = "callers-files"
	RuleBudgets    Rule = "peoples-budgets"
)

// ruleText says each rule in a sentence.
var ruleText = map[Rule]string{
	RuleAllowed:    "allowed",
	RuleObserver:   "an observer only watches: it reads agents and nodes, and opens, drives and answers nothing",
	RuleSubtree:    "an agent reaches only its own subtree, the agents it opened and theirs, unless a person granted it more when opening it",
	RuleSelf:       "an agent does not drive itself",
	RuleOwnAsk:     "an agent answers no permission request of its own or of an agent above it: a person (or an agent above them) does",
	RuleSandboxed:  "a sandboxed agent drives only sandboxed agents: driving one that is not would run its tools outside the sandbox",
	RuleLaxer:      "a sandboxed agent drives only agents held as tightly: one in Landlock alone where it has namespaces of its own, or one that may reach hosts it may not, would run its tools where its own sandbox does not reach",
	RuleSideDoors:  "the dashboard, its API and event stream and the metrics are for people: agents reach Shoal through its MCP endpoint alone",
	RuleOwner:      "a node stores events, records and requests only of the agents the coordinator gave it",
	RuleEnded:      "an agent whose stream ended with its death has nothing more stored until it is reopened",
	RuleNodesOnly:  "only the node that owns an agent stores for it",
	RulePeopleOnly: "a node only hosts agents: it opens, drives, reads and answers nothing through the fabric's doors",
	RuleFiles:      "the files of the machine serving the call (a repository an agent is opened on, one its work is fetched into) are a person's: an agent works in its own checkout",
	RuleBudgets:    "what agents may spend is a person's to set: an agent raises no budget, its own or another's",
}

// Text is the rule in a sentence.
func (r Rule) Text() string { return ruleText[r] }

// Verdict is Decide's answer.
type Verdict struct {
	Allowed bool
	Rule    Rule
}

// Err is nil for an allowed verdict, else a ControlError (code forbidden)
// that says who was refused what (a verb phrase: "send to", "open
// agents"), on which agent, and the rule.
func (d Verdict) Err(p Principal, what string, t Target) error {
	if d.Allowed {
		return nil
	}
	on := ""
	if t.Agent != "" {
		on = " agent " + t.Agent
		if rel := relationWords[t.Rel]; rel != "" && p.Kind == KindAgent {
			on += " (" + rel + ")"
		}
	}
	return Errf(CodeForbidden, "%s may not %s%s: rule %s: %s", p, what, on, d.Rule, d.Rule.Text())
}

// relationWords say how a target stands to an agent, in a refusal.
var relationWords = map[Relation]string{
	RelSelf:       "itself",
	RelChild:      "its child",
	RelDescendant: "its descendant",
	RelParent:     "its parent",
	RelAncestor:   "its ancestor",
	RelSibling:    "its sibling",
	RelRelative:   "a relative in its tree",
	RelUnrelated:  "not of its tree",
}

func allow() Verdict        { return Verdict{Allowed: true, Rule: RuleAllowed} }
func refuse(r Rule) Verdict { return Verdict{Rule: r} }
func decide(ok bool, r Rule) Verdict {
	if ok {
		return allow()
	}
	return refuse(r)
}

// Decide says whether principal p may have access a to target t. It is
// pure: what it needs of the fabric (the target's relation, owner and
// state) is in t.
func Decide(p Principal, a Access, t Target) Verdict {
	switch p.Kind {
	case KindPerson:
		switch a {
		case AccessStore:
			return refuse(RuleNodesOnly)
		case AccessRead, AccessNodes, AccessSideDoor:
			return allow()
		}
		return decide(p.Role == RoleFull, RuleObserver)
	case KindAgent:
		return decideAgent(p, a, t)
	case KindNode:
		if a != AccessStore {
			return refuse(RulePeopleOnly)
		}
		switch {
		case t.Owner != p.Node:
			return refuse(RuleOwner)
		case t.Ended:
			return refuse(RuleEnded)
		}
		return allow()
	}
	return refuse(RulePeopleOnly)
}

func decideAgent(p Principal, a Access, t Target) Verdict {
	switch a {
	case AccessNodes, AccessOpen:
		return allow()
	case AccessSideDoor:
		return refuse(RuleSideDoors)
	case AccessStore:
		return refuse(RuleNodesOnly)
	case AccessFiles:
		return refuse(RuleFiles)
	case AccessBudget:
		return refuse(RuleBudgets)
	case AccessRead:
		if t.Agent == "" {
			return allow() // a listing: each agent in it is judged on its own
		}
		return decide(t.Rel == RelSelf || t.Rel.inSubtree() || p.Reach == ReachRead || p.Reach == ReachAll, RuleSubtree)
	case AccessAnswer:
		if t.Rel == RelSelf || t.Rel == RelParent || t.Rel == RelAncestor {
			return refuse(RuleOwnAsk)
		}
	case AccessAct:
		if t.Rel == RelSelf {
			return refuse(RuleSelf)
		}
	default:
		return refuse(RulePeopleOnly)
	}
	// Acting and answering.
	if !t.Rel.inSubtree() && p.Reach != ReachAll {
		return refuse(RuleSubtree)
	}
	if p.Sandboxed && !t.Sandboxed {
		return refuse(RuleSandboxed)
	}
	if p.Sandboxed && t.Confined.Laxer(p.Confined) {
		return refuse(RuleLaxer)
	}
	return allow()
}

// MaxLineage bounds how far Relate walks an agent's parents: deeper than
// any nesting a coordinator allows.
const MaxLineage = 16

// Relate says how target stands to the agent principal: self, its child or
// descendant, its parent or ancestor, a sibling, a relative in the same
// tree, or unrelated. lookup reads an agent's record by id; a parent that
// cannot be read ends the line there.
func Relate(principal, target AgentRecord, lookup func(id string) (AgentRecord, error)) Relation {
	if target.ID == principal.ID {
		return RelSelf
	}
	line := func(rec AgentRecord) []string { // rec's ancestors, nearest first
		var ids []string
		for p := rec.Parent; p != "" && len(ids) < MaxLineage && !slices.Contains(ids, p); {
			ids = append(ids, p)
			up, err := lookup(p)
			if err != nil {
				break
			}
			p = up.Parent
		}
		return ids
	}
	above := line(target)
	if i := slices.Index(above, principal.ID); i == 0 {
		return RelChild
	} else if i > 0 {
		return RelDescendant
	}
	mine := line(principal)
	if i := slices.Index(mine, target.ID); i == 0 {
		return RelParent
	} else if i > 0 {
		return RelAncestor
	}
	if principal.Parent != "" && principal.Parent == target.Parent {
		return RelSibling
	}
	root := func(rec AgentRecord, above []string) string {
		if len(above) == 0 {
			return rec.ID
		}
		return above[len(above)-1]
	}
	if root(principal, mine) == root(target, above) {
		return RelRelative
	}
	return RelUnrelated
}

// ToolAccess is the access each of Shoal's MCP tools asks, by bare name:
// what the door asks Decide before the tool runs (agent_list and
// agent_pending read each agent they show).
var ToolAccess = map[string]Access{
	"agent_open":      AccessOpen,
	"agent_send":      AccessAct,
	"agent_run":       AccessAct,
	"agent_interrupt": AccessAct,
	"agent_close":     AccessAct,
	"agent_set_model": AccessAct,
	"agent_permit":    AccessAnswer,
	"agent_output":    AccessRead,
	"agent_status":    AccessRead,
	"agent_events":    AccessRead,
	"agent_list":      AccessRead,
	"agent_pending":   AccessRead,
	"agent_nodes":     AccessNodes,
	"agent_diff":      AccessRead,
	"agent_fetch":     AccessFiles,
	"agent_job":       AccessFiles,
}

// ReadOnlyTools are the tools that only read, sorted: all an observer may
// call, derived from ToolAccess and Decide.
func ReadOnlyTools() []string {
	var out []string
	for name, a := range ToolAccess {
		if Decide(Person(RoleObserver), a, Target{}).Allowed {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
