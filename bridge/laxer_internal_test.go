package bridge

import (
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// The door lets a sandboxed agent open a child whose sandbox_net names a
// host as the proxy reads it (in any case, "host" standing for host:443
// and host:80), and the child's record keeps the request's spelling: the
// rule laxer-sandbox reads the hosts the same way, so the parent drives
// the child the door let it open ("pypi.org:443" is no host ["pypi.org"]
// does not reach). An outside review found the rule comparing spellings.
func TestAParentDrivesTheChildTheDoorLetItOpen(t *testing.T) {
	m := &MCP{maxDepth: schemas.DefaultMaxDepth}
	parent := schemas.AgentRecord{ID: "p", Reach: schemas.ReachOwn, SandboxNet: []string{"pypi.org"},
		Sandbox: &schemas.SandboxPolicy{Kernel: "namespaces, landlock ABI 7"}}
	nested := []string{}
	free, _ := schemas.ComposePolicy("", "", nil, &nested, false)
	parent.Policy = free.Record("/w")
	for _, host := range []string{"pypi.org:443", "PyPI.org", "pypi.org:80"} {
		req := schemas.OpenRequest{CWD: "/w/c", SandboxNet: []string{host}}
		if err := m.nested(parent, &req); err != nil {
			t.Fatalf("the door refuses a child with sandbox_net %q: %v", host, err)
		}
		child := schemas.AgentRecord{ID: "c", Parent: "p", Depth: 1, SandboxNet: req.SandboxNet,
			Sandbox: &schemas.SandboxPolicy{Kernel: "namespaces, landlock ABI 7"}}
		rel := schemas.Relate(parent, child, func(string) (schemas.AgentRecord, error) { return parent, nil })
		for _, a := range []schemas.Access{schemas.AccessAct, schemas.AccessAnswer} {
			v := schemas.Decide(schemas.AgentPrincipal(parent), a, schemas.Target{Agent: "c", Rel: rel, Sandboxed: true, Confined: schemas.ConfinedOf(child)})
			if !v.Allowed {
				t.Errorf("the door let p open child c with sandbox_net %q, then the rules refuse p %s on it (rel %v): %s", host, a, rel, v.Rule)
			}
		}
	}
}
