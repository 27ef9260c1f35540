package bridge

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Where no token is set an agent's id is no credential: a local process
// naming a new one for each initialize is held by the bound on sessions
// in all. Past it the least recently used session with no request under
// way is ended, whoever's it is, and one whose requests are all under
// way is never ended for another.
func TestSessionsAreBoundedInAll(t *testing.T) {
	s := newSessions()
	ids := make([]string, sessionsInAll)
	for i := range sessionsInAll {
		who := fmt.Sprintf("agent:made-up-%d", i)
		if ended, err := s.room(who); err != nil || len(ended) > 0 {
			t.Fatalf("session %d: ended %v, %v", i+1, ended, err)
		}
		ids[i] = principalSessions{s: s, who: who}.Generate()
	}
	// The first is in use (a stream open on it), the second was used
	// since: the third is the least recently used.
	busy, ok := s.use("agent:made-up-0", ids[0])
	if !ok {
		t.Fatal("the first session is not its agent's")
	}
	if done, ok := s.use("agent:made-up-1", ids[1]); !ok {
		t.Fatal("the second session is not its agent's")
	} else {
		done()
	}
	ended, err := s.room("everyone")
	if err != nil || !slices.Equal(ended, []string{ids[2]}) {
		t.Fatalf("a session past the bound in all ended %v (%v), want the least recently used, %s", ended, err, ids[2])
	}
	principalSessions{s: s, who: "everyone"}.Generate()
	if len(s.live) != sessionsInAll {
		t.Fatalf("%d sessions live, want %d", len(s.live), sessionsInAll)
	}
	if _, err := (principalSessions{s: s, who: "agent:made-up-2"}).Validate(ids[2]); err == nil {
		t.Error("the session ended for another is still valid")
	}
	// Every session busy: nothing is ended, and the refusal names why.
	for i, id := range ids {
		if i == 0 || i == 2 {
			continue
		}
		s.use(fmt.Sprintf("agent:made-up-%d", i), id)
	}
	for id, ss := range s.live {
		if ss.who == "everyone" {
			s.use("everyone", id)
		}
	}
	if ended, err := s.room("agent:one-more"); err == nil || len(ended) > 0 || !strings.Contains(err.Error(), "the most the endpoint holds, each with a request under way") {
		t.Fatalf("past the bound with every session in use: ended %v, %v", ended, err)
	}
	busy()
	if ended, err := s.room("agent:one-more"); err != nil || !slices.Equal(ended, []string{ids[0]}) {
		t.Fatalf("once the first session's stream ended: ended %v, %v", ended, err)
	}
}

// A principal past its own bound ends its own least recently used
// session, never another's.
func TestSessionsPastAPrincipalsBoundEndItsOwnLeastRecent(t *testing.T) {
	s := newSessions()
	other := principalSessions{s: s, who: "observer"}.Generate()
	var ids []string
	for range sessionsPerAgent {
		if ended, err := s.room("agent:a"); err != nil || len(ended) > 0 {
			t.Fatalf("ended %v, %v", ended, err)
		}
		ids = append(ids, principalSessions{s: s, who: "agent:a"}.Generate())
	}
	done, _ := s.use("agent:a", ids[0])
	done()
	ended, err := s.room("agent:a")
	if err != nil || !slices.Equal(ended, []string{ids[1]}) {
		t.Fatalf("ended %v (%v), want the agent's least recently used, %s", ended, err, ids[1])
	}
	if _, ok := s.live[other]; !ok {
		t.Error("another principal's session was ended")
	}
	if s.count["agent:a"] != sessionsPerAgent-1 {
		t.Errorf("the agent holds %d sessions before its next, want %d", s.count["agent:a"], sessionsPerAgent-1)
	}
}
