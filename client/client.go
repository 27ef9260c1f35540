package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// Repositories works on repositories of the caller's machine: agents
// opened on one, their work brought back, jobs. Only a client with the
// coordinator's rights reaches the repositories' object store: Direct,
// and what wraps one.
type Repositories interface {
	OpenRepo(ctx context.Context, req schemas.OpenRequest, src RepoSource) (schemas.OpenReply, error)
	Diff(ctx context.Context, id string, stat bool) (schemas.DiffReply, error)
	Fetch(ctx context.Context, id, into string, force bool) (Fetched, error)
	RunJob(ctx context.Context, spec JobSpec) (schemas.JobRecord, error)
	Job(ctx context.Context, id string) (schemas.JobRecord, error)
	WaitJob(ctx context.Context, id string) (schemas.JobRecord, error)
}

var _ Repositories = (*Direct)(nil)

// Client drives and watches the fabric: the command line, the TUI, the MCP
// tools and the coordinator's fabric service all use one. Direct reaches
// the nodes, the records and the stream itself; Remote goes through the
// coordinator's fabric service, for credentials that reach neither.
type Client interface {
	// Open starts an agent on the node req names or, through placement,
	// on the least loaded node that can run it.
	Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error)
	// Send writes a user turn to an agent and returns its number.
	Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error)
	// Run sends a turn and waits for its end, watching the agent's record
	// as well as its node.
	Run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error)
	// Interrupt ends an agent's running turn and the turns held behind it.
	Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error)
	// Close stops an agent; an unknown id answers closed false.
	Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error)
	// SetModel repoints an agent at another model.
	SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error)
	// Permit answers a permission request an agent waits on.
	Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error)
	// Pending lists the permission requests agents wait on, oldest
	// first; a list too large for one reply of the fabric service counts
	// those it leaves out (Omitted).
	Pending(ctx context.Context) (schemas.PendingReply, error)
	// Output reads an agent's output from the stream (agent_output).
	Output(ctx context.Context, req schemas.OutputRequest) (schemas.OutputReply, error)
	// Status returns an agent's record from its node, the fabric's
	// records, or, for an agent no longer kept, the stream.
	Status(ctx context.Context, id string) (schemas.AgentRecord, error)
	// Record reads an agent's record as the fabric keeps it.
	Record(ctx context.Context, id string) (schemas.AgentRecord, error)
	// List returns every agent record, dead ones included, oldest first.
	List(ctx context.Context) ([]schemas.AgentRecord, error)
	// Nodes lists the nodes whose heartbeat is current, by name.
	Nodes(ctx context.Context) ([]schemas.NodeRecord, error)
	// Events reads a page of an agent's stored events.
	Events(ctx context.Context, req schemas.EventsRequest) (schemas.EventsReply, error)
	// SetBudget sets what an agent, the fleet or a label's nodes may
	// spend; Budgets reads every budget with what was used against it.
	SetBudget(ctx context.Context, req schemas.BudgetRequest) error
	Budgets(ctx context.Context) (schemas.BudgetsReply, error)
	// Replay delivers agents' events from a point to fn (see Direct.Replay).
	Replay(ctx context.Context, ids []string, from From, follow bool, fn func(Replayed, *Gap) error) error
	// Conn is the client's NATS connection.
	Conn() *nats.Conn
}

// Config configures a client; its zero value works.
type Config struct {
	// Timeout bounds a request when the caller's context has no deadline;
	// 30s when zero.
	Timeout time.Duration
	// ViaCoordinator makes New return a Remote: every request goes
	// through the coordinator's fabric service, as scoped credentials
	// require.
	ViaCoordinator bool
	// ReadOnly refuses, before asking anyone, what an observer's
	// credentials may not do: open, send, run, interrupt, close and
	// set_model. The server would refuse them anyway, but only by letting
	// the request time out.
	ReadOnly bool
	// Progress, when set, is told in a line each what a long transfer
	// (a repository sent to a node) has done so far.
	Progress func(string)
	// MaxBundle is the largest bundle of a repository sent to a node;
	// DefaultMaxBundle when zero.
	MaxBundle int64
}

func (c Config) timeout() time.Duration {
	if c.Timeout == 0 {
		return 30 * time.Second
	}
	return c.Timeout
}

// New returns the client cfg asks for on nc.
func New(nc *nats.Conn, cfg Config) (Client, error) {
	if cfg.ViaCoordinator {
		return NewRemote(nc, cfg), nil
	}
	return NewDirect(nc, cfg)
}

// requestID returns id, or a fresh one, so that a retried request is
// recognised by its owner.
func requestID(id string) string {
	if id != "" {
		return id
	}
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
