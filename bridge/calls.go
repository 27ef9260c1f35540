package bridge

import (
	"context"
	"fmt"
	"sync"
)

// A tool call under way holds what it waits with: agent_run a watch of
// the agent's record (and, asked for progress, a reader of its events),
// agent_output and agent_events a reader of the stream while they read.
// Each is a JetStream consumer, and a stream has at most 1,000 of them
// for everyone (the server's default), the fabric's own readers and every
// client's among them. So the calls under way at once are bounded per
// caller, and the agents' together: a caller past its bound is told so
// at once, and nobody else's calls wait on it.
const (
	// callsPerAgent bounds the calls one agent has under way (a CLI
	// makes a few at once at most).
	callsPerAgent = 8
	// callsOfAgents bounds the calls all agents have under way together:
	// a family of agents is many callers.
	callsOfAgents = 256
	// callsPerToken bounds the calls under the full token, under the
	// observer token, and of everyone on an endpoint without tokens (and
	// of the stdio endpoint's one client).
	callsPerToken = 64
)

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
