package bridge

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// An MCP session (what an initialize begins) costs the endpoint about
// 12 KB until the client ends it, and a client need not: mcp-go keeps
// every session it never hears the end of. So each principal (the full
// token, the observer token, an agent, or everyone where no token is
// set) may hold a bounded number at once; a session idle for
// sessionIdle is ended; and an initialize past the bound is refused,
// naming it. One principal's sessions take nothing from another's.
const (
	// sessionsPerToken bounds the sessions of the full token, of the
	// observer token, and of everyone on an endpoint without tokens.
	sessionsPerToken = 1000
	// sessionsPerAgent bounds the sessions of one agent (its CLI makes
	// one per life).
	sessionsPerAgent = 16
	// sessionsInAll bounds the sessions of every caller together (about
	// 100 MB): where no token is set, an agent's id is no credential, and
	// a local process naming a new one for each initialize would
	// otherwise have no bound at all.
	sessionsInAll = 8192
	// sessionIdle ends a session nothing has used for this long; its
	// client's next request is told the session is unknown, and a client
	// then begins another (as MCP has it).
	sessionIdle = 2 * time.Hour
	// maxMCPBody bounds a request's body: past the largest message the
	// fabric carries (8 MiB by default), with room for its JSON.
	maxMCPBody = 16 << 20
)

// sessionPrefix begins every session id the endpoint makes.
const sessionPrefix = "shoal-mcp-"

// sessions are the endpoint's live MCP sessions, by principal.
type sessions struct {
	mu    sync.Mutex
	owner map[string]string // session id -> principal
	count map[string]int    // principal -> live sessions
}

func newSessions() *sessions {
	return &sessions{owner: map[string]string{}, count: map[string]int{}}
}

// principalKey is the context key of a request's principal.
type principalKey struct{}

// withPrincipal notes who is calling, for the session manager.
func withPrincipal(r *http.Request, who string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, who))
}

// bound is the most sessions principal who may hold.
func bound(who string) int {
	if isAgentPrincipal(who) {
		return sessionsPerAgent
	}
	return sessionsPerToken
}

func isAgentPrincipal(who string) bool { return len(who) > 6 && who[:6] == "agent:" }

// full says why principal who may begin no session now, or nil.
func (s *sessions) full(who string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.count[who]; n >= bound(who) {
		return fmt.Errorf("%d MCP sessions are open under these credentials, the most they may hold: end one (DELETE with its Mcp-Session-Id), or wait for one to be idle %s", n, sessionIdle)
	}
	if n := len(s.owner); n >= sessionsInAll {
		return fmt.Errorf("%d MCP sessions are open, the most the endpoint holds: wait for one to end or be idle %s", n, sessionIdle)
	}
	return nil
}

// owns reports whether session id is one of principal who's.
func (s *sessions) owns(who, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	owner, ok := s.owner[id]
	return ok && owner == who
}

// ResolveSessionIdManager is the session manager for a request: its
// principal's, or, for the endpoint's own sweep of idle sessions (r
// nil), one that ends any.
func (s *sessions) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	who := ""
	if r != nil {
		who, _ = r.Context().Value(principalKey{}).(string)
	}
	return principalSessions{s: s, who: who, any: r == nil}
}

// principalSessions makes, checks and ends the sessions of one principal.
type principalSessions struct {
	s   *sessions
	who string
	any bool // the sweep: ends any principal's session
}

func (p principalSessions) Generate() string {
	id := sessionPrefix + rand.Text()
	p.s.mu.Lock()
	p.s.owner[id] = p.who
	p.s.count[p.who]++
	p.s.mu.Unlock()
	return id
}

// errUnknownSession is a session id the endpoint did not make, has
// ended, or made for other credentials.
var errUnknownSession = errors.New("no such session")

func (p principalSessions) Validate(id string) (bool, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if who, ok := p.s.owner[id]; !ok || (who != p.who && !p.any) {
		return false, errUnknownSession
	}
	return false, nil
}

func (p principalSessions) Terminate(id string) (bool, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	who, ok := p.s.owner[id]
	switch {
	case !ok:
		return false, nil // ended already
	case who != p.who && !p.any:
		return true, nil // another's: not these credentials' to end
	}
	delete(p.s.owner, id)
	if p.s.count[who]--; p.s.count[who] <= 0 {
		delete(p.s.count, who)
	}
	return false, nil
}
