package schemas

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// row is one line of the rights table: a principal asking about a target,
// and what each access gets ("" allowed, else the rule that refuses it).
type row struct {
	who    string
	p      Principal
	t      Target
	answer map[Access]Rule
}

// agentRow is an agent with reach asking about a target related by rel.
func agentRow(who string, reach Reach, sandboxed bool, t Target, read, act, answer Rule) row {
	return row{who, Principal{Kind: KindAgent, Agent: "a1", Reach: reach, Sandboxed: sandboxed}, t, map[Access]Rule{
		AccessRead: read, AccessAct: act, AccessAnswer: answer,
		AccessOpen: "", AccessNodes: "", AccessSideDoor: RuleSideDoors, AccessStore: RuleNodesOnly, AccessFiles: RuleFiles, AccessBudget: RuleBudgets,
	}}
}

// confinedRow is a sandboxed agent granted reach all, held as p, asking
// about an unrelated sandboxed agent held as t.
func confinedRow(who string, p, t Confined, act Rule) row {
	r := agentRow(who, ReachAll, true, rel(RelUnrelated), "", act, act)
	r.p.Confined = p
	r.t.Sandboxed, r.t.Confined = true, t
	return r
}

func nodeRow(who string, t Target, store Rule) row {
	m := map[Access]Rule{AccessStore: store}
	for _, a := range Accesses {
		if a != AccessStore {
			m[a] = RulePeopleOnly
		}
	}
	return row{who, NodePrincipal("n1"), t, m}
}

func rel(r Relation) Target { return Target{Agent: "b2", Rel: r, Owner: "n1"} }

// rightsTable is who may do what: the contract the README's table states
// and every surface is held to.
var rightsTable = []row{
	{"a person, full token or client credentials", Person(RoleFull), rel(RelNone), map[Access]Rule{
		AccessRead: "", AccessAct: "", AccessAnswer: "", AccessOpen: "", AccessNodes: "", AccessSideDoor: "", AccessStore: RuleNodesOnly, AccessFiles: "", AccessBudget: ""}},
	{"a person, observer token or credentials", Person(RoleObserver), rel(RelNone), map[Access]Rule{
		AccessRead: "", AccessAct: RuleObserver, AccessAnswer: RuleObserver, AccessOpen: RuleObserver, AccessNodes: "", AccessSideDoor: "", AccessStore: RuleNodesOnly, AccessFiles: RuleObserver, AccessBudget: RuleObserver}},
	agentRow("an agent, about itself", ReachOwn, false, rel(RelSelf), "", RuleSelf, RuleOwnAsk),
	agentRow("an agent, about its child", ReachOwn, false, rel(RelChild), "", "", ""),
	agentRow("an agent, about its grandchild or deeper", ReachOwn, false, rel(RelDescendant), "", "", ""),
	agentRow("an agent, about its parent", ReachOwn, false, rel(RelParent), RuleSubtree, RuleSubtree, RuleOwnAsk),
	agentRow("an agent, about an ancestor above its parent", ReachOwn, false, rel(RelAncestor), RuleSubtree, RuleSubtree, RuleOwnAsk),
	agentRow("an agent, about a sibling", ReachOwn, false, rel(RelSibling), RuleSubtree, RuleSubtree, RuleSubtree),
	agentRow("an agent, about another agent of its tree", ReachOwn, false, rel(RelRelative), RuleSubtree, RuleSubtree, RuleSubtree),
	agentRow("an agent, about an unrelated agent (another client's)", ReachOwn, false, rel(RelUnrelated), RuleSubtree, RuleSubtree, RuleSubtree),
	agentRow("an agent granted reach read, about an unrelated agent", ReachRead, false, rel(RelUnrelated), "", RuleSubtree, RuleSubtree),
	agentRow("an agent granted reach all, about an unrelated agent", ReachAll, false, rel(RelUnrelated), "", "", ""),
	agentRow("an agent granted reach all, about its parent", ReachAll, false, rel(RelParent), "", "", RuleOwnAsk),
	agentRow("a sandboxed agent granted reach all, about an unsandboxed agent", ReachAll, true, rel(RelUnrelated), "", RuleSandboxed, RuleSandboxed),
	confinedRow("a sandboxed agent granted reach all, about one in Landlock alone where it has namespaces",
		Confined{Namespaces: true}, Confined{}, RuleLaxer),
	confinedRow("a sandboxed agent granted reach all, about one that may reach a host it may not",
		Confined{Namespaces: true, Net: []string{"pypi.org"}}, Confined{Namespaces: true, Net: []string{"pypi.org", "example.com"}}, RuleLaxer),
	confinedRow("a sandboxed agent granted reach all, about one held as tightly or more",
		Confined{Net: []string{"pypi.org"}}, Confined{Namespaces: true}, ""),
	nodeRow("a node, about an agent it was given", Target{Agent: "b2", Owner: "n1"}, ""),
	nodeRow("a node, about another node's agent", Target{Agent: "b2", Owner: "n2"}, RuleOwner),
	nodeRow("a node, about its agent whose life ended", Target{Agent: "b2", Owner: "n1", Ended: true}, RuleEnded),
}

// Every principal, access and relation the rights rules know, decided as
// the table says.
func TestRightsTable(t *testing.T) {
	seen := map[Relation]bool{}
	for _, r := range rightsTable {
		if r.p.Kind == KindAgent {
			seen[r.t.Rel] = true
		}
		for _, a := range Accesses {
			want, listed := r.answer[a]
			if !listed {
				t.Errorf("%s: the table says nothing of %s", r.who, a)
				continue
			}
			v := Decide(r.p, a, r.t)
			if v.Allowed != (want == "") || (!v.Allowed && v.Rule != want) {
				t.Errorf("%s, %s: Decide says %+v, the table %q", r.who, a, v, want)
			}
			err := v.Err(r.p, "do it to", r.t)
			var ce *ControlError
			switch {
			case v.Allowed && err != nil:
				t.Errorf("%s, %s: allowed, yet Err is %v", r.who, a, err)
			case !v.Allowed && (!errors.As(err, &ce) || ce.Code != CodeForbidden || !strings.Contains(ce.Message, "rule "+string(v.Rule)+": "+v.Rule.Text())):
				t.Errorf("%s, %s: the refusal %v does not name its rule", r.who, a, err)
			}
		}
	}
	for _, rel := range Relations {
		if !seen[rel] {
			t.Errorf("no row of the table asks about an agent's %s", rel)
		}
	}
}

// The README's "Who may do what" table says exactly what Decide does.
func TestReadmeRightsTable(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(b), "\n## Who may do what\n")
	if !found {
		t.Fatal(`the README has no "## Who may do what" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	columns := map[string]Access{"read": AccessRead, "drive": AccessAct, "answer": AccessAnswer, "open": AccessOpen,
		"nodes": AccessNodes, "dashboard, metrics": AccessSideDoor, "store": AccessStore, "files": AccessFiles, "budgets": AccessBudget}
	byWho := map[string]row{}
	for _, r := range rightsTable {
		byWho[r.who] = r
	}
	var head []string
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if head != nil {
				break // the table ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case head == nil:
			head = cells
			continue
		case strings.HasPrefix(cells[0], "---"):
			continue
		}
		r, ok := byWho[cells[0]]
		if !ok {
			t.Errorf("the README's row %q is no row of the rights table", cells[0])
			continue
		}
		rows++
		for i, cell := range cells[1:] {
			a, ok := columns[head[i+1]]
			if !ok {
				t.Fatalf("the README's column %q is no access", head[i+1])
			}
			want := "yes"
			if rule := r.answer[a]; rule != "" {
				want = "no (" + string(rule) + ")"
			}
			if cell != want {
				t.Errorf("README, %s, %s: %q, but the rules say %q", r.who, head[i+1], cell, want)
			}
		}
	}
	if rows != len(rightsTable) {
		t.Errorf("the README's table has %d rows, the rights table %d", rows, len(rightsTable))
	}
}

// Relate tells each relation apart by the records' parents.
func TestRelate(t *testing.T) {
	recs := map[string]AgentRecord{
		"root": {ID: "root"}, "p": {ID: "p", Parent: "root"}, "a": {ID: "a", Parent: "p"},
		"kid": {ID: "kid", Parent: "a"}, "grand": {ID: "grand", Parent: "kid"}, "sib": {ID: "sib", Parent: "p"},
		"cousin": {ID: "cousin", Parent: "sib"}, "other": {ID: "other"}, "orphan": {ID: "orphan", Parent: "gone"},
		"loop1": {ID: "loop1", Parent: "loop2"}, "loop2": {ID: "loop2", Parent: "loop1"},
	}
	lookup := func(id string) (AgentRecord, error) {
		if r, ok := recs[id]; ok {
			return r, nil
		}
		return AgentRecord{}, errors.New("no such agent")
	}
	for target, want := range map[string]Relation{
		"a": RelSelf, "kid": RelChild, "grand": RelDescendant, "p": RelParent, "root": RelAncestor,
		"sib": RelSibling, "cousin": RelRelative, "other": RelUnrelated, "orphan": RelUnrelated, "loop1": RelUnrelated,
	} {
		if got := Relate(recs["a"], recs[target], lookup); got != want {
			t.Errorf("%s to a: %s, want %s", target, got, want)
		}
	}
}

// The README's sentence on the observer token names exactly the tools it
// may call.
func TestReadmeObserverTools(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(string(b), "`--mcp-observer-token` one that only sees and calls the tools that read:")
	if !found {
		t.Fatal("the README does not say which tools the observer token calls")
	}
	list, _, _ := strings.Cut(rest, "(")
	var said []string
	for _, name := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' }) {
		if name != "and" {
			said = append(said, name)
		}
	}
	slices.Sort(said)
	if want := ReadOnlyTools(); !slices.Equal(said, want) {
		t.Errorf("the README names %v for the observer token; it calls %v", said, want)
	}
}
