package node

import (
	"path/filepath"
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

// A request's wait that ends (its deadline, its turn or its agent's end)
// settles it with the node's own denial, unless a person answered first;
// when the agent was retired meanwhile, which forgets its requests, the
// denial stands: an outside review's node took the forgotten request's
// missing answer and died of it, with every agent on it.
func TestSettlingARequestTheBookForgotDeniesIt(t *testing.T) {
	b := newPermitBook(filepath.Join(t.TempDir(), "permits.json"))
	mine := schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "closed", Message: "the agent ended"}
	b.open(schemas.PermitRecord{AgentID: "a1", RequestID: "r1"})
	b.forget("a1")
	if got := b.settleOne("a1", "r1", mine); got.By != mine.By || got.Decision != mine.Decision {
		t.Errorf("a forgotten request settled as %+v, want the node's denial", got)
	}
	b.open(schemas.PermitRecord{AgentID: "a1", RequestID: "r2"})
	person := schemas.PermitAnswer{Decision: schemas.DecisionAllow, By: "alice"}
	if _, err := b.answer("a1", "r2", person); err != nil {
		t.Fatal(err)
	}
	if got := b.settleOne("a1", "r2", mine); got.By != person.By || got.Decision != person.Decision {
		t.Errorf("a request a person answered first settled as %+v, want the person's answer", got)
	}
	b.open(schemas.PermitRecord{AgentID: "a1", RequestID: "r3"})
	if got := b.settleOne("a1", "r3", mine); got.By != mine.By || got.Decision != mine.Decision {
		t.Errorf("a waiting request settled as %+v, want the node's denial", got)
	}
}
