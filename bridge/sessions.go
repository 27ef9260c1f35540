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
// every session it never hears the end of, and a client that is killed
// (or a script that initializes per call) never says. So each principal
// (the full token, the observer token, an agent, or everyone where no
// token is set) holds a bounded number at once: an initialize past the
// bound ends that principal's least recently used session that has no
// request under way, whose client's next request is told the session is
// unknown (and a client then begins another, as MCP has it). One
// principal's sessions take nothing from another's, except past the
// bound on sessions in all. A session idle for sessionIdle is ended too.
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
	// otherwise have no bound at all. Past it the least recently used
	// session of anyone's is ended.
	sessionsInAll = 8192
	// sessionIdle ends a session nothing has used for this long.
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
	tick  uint64              // counts uses, to order sessions by their last
	live  map[string]*session // session id -> its principal and use
	count map[string]int      // principal -> live sessions
}

// session is one live MCP session.
type session struct {
	who  string // its principal
	used uint64 // the endpoint's tick when it was last used
	busy int    // requests on it under way
}

func newSessions() *sessions {
	return &sessions{live: map[string]*session{}, count: map[string]int{}}
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

// room makes room for a session of principal who: past who's bound (or
// the bound on sessions in all), the least recently used session with
// no request under way, who's (or anyone's), is ended here, and its id
// returned for the MCP library to forget. It fails, naming the bound,
// when every session it could end has a request under way.
func (s *sessions) room(who string) (ended []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.count[who] >= bound(who) {
		id := s.leastRecent(who)
		if id == "" {
			return ended, fmt.Errorf("%d MCP sessions are open under these credentials, the most they may hold, each with a request under way: end one (DELETE with its Mcp-Session-Id)", s.count[who])
		}
		s.end(id)
		ended = append(ended, id)
	}
	for len(s.live) >= sessionsInAll {
		id := s.leastRecent("")
		if id == "" {
			return ended, fmt.Errorf("%d MCP sessions are open, the most the endpoint holds, each with a request under way: wait for one to end", len(s.live))
		}
		s.end(id)
		ended = append(ended, id)
	}
	return ended, nil
}

// leastRecent is the least recently used session of principal who (of
// anyone's, who empty) with no request under way, or "" if none.
func (s *sessions) leastRecent(who string) string {
	oldest, at := "", uint64(0)
	for id, ss := range s.live {
		if (who == "" || ss.who == who) && ss.busy == 0 && (oldest == "" || ss.used < at) {
			oldest, at = id, ss.used
		}
	}
	return oldest
}

// end forgets session id; the caller holds s.mu.
func (s *sessions) end(id string) {
	ss, ok := s.live[id]
	if !ok {
		return
	}
	delete(s.live, id)
	if s.count[ss.who]--; s.count[ss.who] <= 0 {
		delete(s.count, ss.who)
	}
}

// use marks session id, if it is principal who's, used, with a request
// under way until done is called; ok is false (and done does nothing)
// for a session that is not who's.
func (s *sessions) use(who, id string) (done func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.live[id]
	if !ok || ss.who != who {
		return func() {}, false
	}
	s.tick++
	ss.used, ss.busy = s.tick, ss.busy+1
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		ss.busy--
	}), true
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
	defer p.s.mu.Unlock()
	p.s.tick++
	p.s.live[id] = &session{who: p.who, used: p.s.tick}
	p.s.count[p.who]++
	return id
}

// errUnknownSession is a session id the endpoint did not make, has
// ended, or made for other credentials.
var errUnknownSession = errors.New("no such session")

func (p principalSessions) Validate(id string) (bool, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if ss, ok := p.s.live[id]; !ok || (ss.who != p.who && !p.any) {
		return false, errUnknownSession
	}
	return false, nil
}

func (p principalSessions) Terminate(id string) (bool, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	ss, ok := p.s.live[id]
	switch {
	case !ok:
		return false, nil // ended already
	case ss.who != p.who && !p.any:
		return true, nil // another's: not these credentials' to end
	}
	p.s.end(id)
	return false, nil
}
