package bridge

import (
	"context"
	"fmt"
	"sync"
)

// A call of one of the reading tools holds what it waits with while it
// is under way: agent_run a watch of the agent's record (a consumer of
// the agents bucket's stream) and, asked for progress, a reader of the
// agent's events; agent_output and agent_events a reader of the events
// while they read; an agent's agent_open a watch of its node's entry
// while the node opens; agent_job a watch of its job's record, or of its
// agent's turns while it runs them. Each is a JetStream consumer, and a stream has at most
// 1,000 of them for everyone (the server's default), the fabric's own
// readers and every client's among them. So those calls under way at
// once are bounded per caller, and the agents' together: a caller past
// its bound is told so at once, and nobody else's calls wait on it. The
// other tools hold nothing while they wait and are not bounded here: an
// agent at its bound may still interrupt or close what it runs.
const (
	// callsPerAgent bounds the reading calls one agent has under way: an
	// agent running its children's turns side by side waits on each.
	callsPerAgent = 16
	// callsOfAgents bounds the reading calls all agents have under way
	// together: a family of agents is many callers.
	callsOfAgents = 256
	// callsPerToken bounds the reading calls under the full token, under
	// the observer token, and of everyone on an endpoint without tokens
	// (and of the stdio endpoint's one client).
	callsPerToken = 64
)

// readingTools are the tools whose calls hold a reader while under way.
// A detached job's call ends at once, but its job holds readers until it
// ends: it stays counted among its caller's calls until then.
var readingTools = map[string]bool{"agent_run": true, "agent_output": true, "agent_events": true, "agent_job": true}

// bounded reports whether a call of tool is counted among its caller's
// calls under way: the reading tools', and an agent's opens (each holds
// a watch of its node's entry while the node opens, and an agent's open
// goes on to its end whether or not the agent waits for it; a person's
// ends with its caller).
func bounded(ctx context.Context, tool string) bool {
	return readingTools[tool] || tool == "agent_open" && callingAgent(ctx) != ""
}

// calls counts the tool calls under way, by caller.
type calls struct {
	mu     sync.Mutex
	under  map[string]int // caller -> calls under way
	agents int            // of all agents together
}

func newCalls() *calls { return &calls{under: map[string]int{}} }

// callerOf names who makes a call, as the session bounds name callers:
// the calling agent, else the principal its HTTP request was admitted
// as, else everyone.
func callerOf(ctx context.Context) string {
	if id := callingAgent(ctx); id != "" {
		return "agent:" + id
	}
	if who, _ := ctx.Value(principalKey{}).(string); who != "" {
		return who
	}
	return "everyone"
}

// begin counts a call of who's, or says why it may not begin now; end
// is called once the call is over.
func (c *calls) begin(who string) (end func(), err error) {
	agent := isAgentPrincipal(who)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch n := c.under[who]; {
	case agent && n >= callsPerAgent:
		return nil, fmt.Errorf("%d calls of agent %s are under way, the most one agent may make at once: wait for one to end", n, who[len("agent:"):])
	case agent && c.agents >= callsOfAgents:
		return nil, fmt.Errorf("%d calls of agents are under way, the most the endpoint serves agents at once: wait for one to end", c.agents)
	case !agent && n >= callsPerToken:
		return nil, fmt.Errorf("%d calls under these credentials are under way, the most they may make at once: wait for one to end", n)
	}
	c.under[who]++
	if agent {
		c.agents++
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.under[who]--; c.under[who] <= 0 {
			delete(c.under, who)
		}
		if agent {
			c.agents--
		}
	}, nil
}

// A callHold is a counted call's end, which a tool whose work outlives
// its call (a detached job) may take over.
type callHold struct {
	mu   sync.Mutex
	end  func()
	kept bool
}

type callHoldKey struct{}

// holdCall puts the end of a counted call in ctx; the handler calls the
// returned func as the call returns, which ends it unless kept.
func holdCall(ctx context.Context, end func()) (context.Context, func()) {
	h := &callHold{end: end}
	return context.WithValue(ctx, callHoldKey{}, h), func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.kept {
			h.end()
		}
	}
}

// keepCall keeps ctx's call counted past its return, until the returned
// func is called (once; later calls do nothing). A call not counted
// gets a func that does nothing.
func keepCall(ctx context.Context) func() {
	h, _ := ctx.Value(callHoldKey{}).(*callHold)
	if h == nil {
		return func() {}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.kept = true
	return sync.OnceFunc(h.end)
}
