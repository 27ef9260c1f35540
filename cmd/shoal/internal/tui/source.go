package tui

import (
	"context"
	"errors"
	"time"

	"github.com/shoalfabric/shoal/schemas"
)

// Source is where the monitor reads the fabric and what it acts on.
type Source interface {
	// Agents lists every agent's record.
	Agents(ctx context.Context) ([]schemas.AgentRecord, error)
	// Nodes lists the nodes whose heartbeat is current.
	Nodes(ctx context.Context) ([]schemas.NodeRecord, error)
	// Follow calls fn with every agent's events from the point from
	// names, as they are published, until ctx ends (it then returns nil)
	// or the connection is lost (an error). It may deliver again events
	// the monitor has already seen; the monitor drops them by number.
	Follow(ctx context.Context, from Resume, fn func(Event)) error
	// History returns an agent's stored events, oldest first, at most max
	// of the newest.
	History(ctx context.Context, agent string, max int) ([]Event, error)

	// Open starts an agent.
	Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error)
	// Send writes a user turn to an agent.
	Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error)
	// Interrupt ends an agent's running turn.
	Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error)
	// SetModel repoints an agent at another model.
	SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error)
	// Close stops an agent.
	Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error)

	// Pending lists the permission requests agents are waiting on; it
	// returns an error wrapping ErrNoPermits when the fabric does not
	// serve them. Omitted counts those a list too large for one reply
	// leaves out.
	Pending(ctx context.Context) (schemas.PendingReply, error)
	// Permit answers a permission request.
	Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error)
}

// Differ is a Source that can say how many files an agent opened on a
// repository has changed against its start: the monitor shows the count
// of the selected one.
type Differ interface {
	Changed(ctx context.Context, agent string) (files int, err error)
}

// Spender is a Source that can say what the fleet spent and its
// budgets: the monitor's header shows the fleet's spend, against its
// budget when it has one.
type Spender interface {
	Budgets(ctx context.Context) (schemas.BudgetsReply, error)
}

// ErrNoPermits is what Pending and Permit return, wrapped or not, when
// the fabric does not serve permission requests: the monitor then shows
// no marker and says so when asked.
var ErrNoPermits = errors.New("this fabric does not serve permission requests")

// Event is one of an agent's events as the monitor receives it.
type Event struct {
	Agent string
	// N is the event's number among the agent's (1 is its first); 0 for
	// what is not one of its events, such as a note that some are missing.
	N uint64
	// Stored is when the stream stored it; zero when unknown.
	Stored time.Time
	Event  schemas.Event
}

// Resume is where a follow starts. Its zero value is from now; after a
// lost connection, the follower asks for every event stored at or after
// Since, the time the last one it saw was stored, and Last says, for each
// agent it has seen, the number of the last event seen.
type Resume struct {
	Since time.Time
	Last  map[string]uint64
}
