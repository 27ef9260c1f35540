package bridge

import (
	"fmt"
	"strings"
	"testing"
)

// Where no token is set an agent's id is no credential: a local process
// naming a new one for each initialize is held by the bound on sessions
// in all, and an ended session frees its place.
func TestSessionsAreBoundedInAll(t *testing.T) {
	s := newSessions()
	var last string
	for i := range sessionsInAll {
		who := fmt.Sprintf("agent:made-up-%d", i)
		if err := s.full(who); err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		last = principalSessions{s: s, who: who}.Generate()
	}
	if err := s.full("agent:one-more"); err == nil || !strings.Contains(err.Error(), "the most the endpoint holds") {
		t.Fatalf("a session past the bound in all: %v", err)
	}
	if err := s.full("everyone"); err == nil {
		t.Fatal("everyone's session past the bound in all was let in")
	}
	if _, err := (principalSessions{s: s, who: fmt.Sprintf("agent:made-up-%d", sessionsInAll-1)}).Terminate(last); err != nil {
		t.Fatal(err)
	}
	if err := s.full("everyone"); err != nil {
		t.Errorf("after a session ended: %v", err)
	}
}
