package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// The coordinator's parts each hold a NATS connection for as long as they
// run. The server closes a connection for good when a client breaks the
// protocol (a subject past the control line, say); nothing Shoal builds
// from a request can do that any more, since every edge checks ids and
// sizes first, but a part whose connection is closed anyway connects
// again, and says so, rather than failing every request until a restart.

// redialing is a client.Client that makes a new direct client on a new
// connection when the server has closed the one it had.
type redialing struct {
	ctx     context.Context
	name    string
	connect connector
	log     *slog.Logger

	mu   sync.Mutex
	cur  *client.Direct
	all  []*nats.Conn
	last time.Time // when it last tried to connect again
}

// newRedialing connects for the first time.
func newRedialing(ctx context.Context, name string, connect connector, log *slog.Logger) (*redialing, error) {
	r := &redialing{ctx: ctx, name: name, connect: connect, log: log}
	f, err := r.dial()
	if err != nil {
		return nil, err
	}
	r.cur = f
	return r, nil
}

func (r *redialing) dial() (*client.Direct, error) {
	nc, err := r.connect(r.name)
	if err != nil {
		return nil, err
	}
	f, err := client.NewDirect(nc, client.Config{})
	if err == nil {
		err = f.WatchNodes(r.ctx)
	}
	if err == nil {
		// The dashboard's pages and MCP's agent_status ask what waits.
		err = f.WatchPermits(r.ctx)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	r.all = append(r.all, nc)
	return f, nil
}

var _ client.Repositories = (*redialing)(nil)

// get is the current client, connected again if the server closed the
// last connection (at most once a second).
func (r *redialing) get() *client.Direct {
	r.mu.Lock()
	defer r.mu.Unlock()
	nc := r.cur.Conn()
	if !nc.IsClosed() || r.ctx.Err() != nil || time.Since(r.last) < time.Second {
		return r.cur
	}
	r.last = time.Now()
	why := "closed"
	if err := nc.LastError(); err != nil {
		why = err.Error()
	}
	f, err := r.dial()
	if err != nil {
		r.log.Error("the server closed a NATS connection, and connecting again failed", "connection", r.name, "closed", why, "err", err)
		return r.cur
	}
	r.log.Warn("the server closed a NATS connection; connected again", "connection", r.name, "closed", why)
	r.cur = f
	return f
}

// closeAll closes every connection it made.
func (r *redialing) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nc := range r.all {
		nc.Close()
	}
}

func (r *redialing) Open(ctx context.Context, req schemas.OpenRequest) (schemas.OpenReply, error) {
	return r.get().Open(ctx, req)
}

func (r *redialing) OpenRepo(ctx context.Context, req schemas.OpenRequest, src client.RepoSource) (schemas.OpenReply, error) {
	return r.get().OpenRepo(ctx, req, src)
}

func (r *redialing) Diff(ctx context.Context, id string, stat bool) (schemas.DiffReply, error) {
	return r.get().Diff(ctx, id, stat)
}

func (r *redialing) Fetch(ctx context.Context, id, into string, force bool) (client.Fetched, error) {
	return r.get().Fetch(ctx, id, into, force)
}

func (r *redialing) RunJob(ctx context.Context, spec client.JobSpec) (schemas.JobRecord, error) {
	return r.get().RunJob(ctx, spec)
}

func (r *redialing) Job(ctx context.Context, id string) (schemas.JobRecord, error) {
	return r.get().Job(ctx, id)
}

func (r *redialing) WaitJob(ctx context.Context, id string) (schemas.JobRecord, error) {
	return r.get().WaitJob(ctx, id)
}

func (r *redialing) Send(ctx context.Context, req schemas.SendRequest) (schemas.SendReply, error) {
	return r.get().Send(ctx, req)
}

func (r *redialing) Run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	return r.get().Run(ctx, req)
}

func (r *redialing) Interrupt(ctx context.Context, req schemas.AgentRequest) (schemas.InterruptReply, error) {
	return r.get().Interrupt(ctx, req)
}

func (r *redialing) Close(ctx context.Context, req schemas.AgentRequest) (schemas.CloseReply, error) {
	return r.get().Close(ctx, req)
}

func (r *redialing) SetModel(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
	return r.get().SetModel(ctx, req)
}

func (r *redialing) Permit(ctx context.Context, req schemas.PermitRequest) (schemas.PermitReply, error) {
	return r.get().Permit(ctx, req)
}

func (r *redialing) Pending(ctx context.Context) (schemas.PendingReply, error) {
	return r.get().Pending(ctx)
}

func (r *redialing) Output(ctx context.Context, req schemas.OutputRequest) (schemas.OutputReply, error) {
	return r.get().Output(ctx, req)
}

func (r *redialing) Status(ctx context.Context, id string) (schemas.AgentRecord, error) {
	return r.get().Status(ctx, id)
}

func (r *redialing) Record(ctx context.Context, id string) (schemas.AgentRecord, error) {
	return r.get().Record(ctx, id)
}

func (r *redialing) List(ctx context.Context) ([]schemas.AgentRecord, error) {
	return r.get().List(ctx)
}

func (r *redialing) Nodes(ctx context.Context) ([]schemas.NodeRecord, error) {
	return r.get().Nodes(ctx)
}

func (r *redialing) SetBudget(ctx context.Context, req schemas.BudgetRequest) error {
	return r.get().SetBudget(ctx, req)
}

func (r *redialing) Budgets(ctx context.Context) (schemas.BudgetsReply, error) {
	return r.get().Budgets(ctx)
}

func (r *redialing) Events(ctx context.Context, req schemas.EventsRequest) (schemas.EventsReply, error) {
	return r.get().Events(ctx, req)
}

func (r *redialing) Replay(ctx context.Context, ids []string, from client.From, follow bool, fn func(client.Replayed, *client.Gap) error) error {
	return r.get().Replay(ctx, ids, from, follow, fn)
}

func (r *redialing) Conn() *nats.Conn { return r.get().Conn() }
