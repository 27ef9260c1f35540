package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// tool is one MCP tool: its arguments are the embedded request schema
// named by schema, checked and unmarshalled into the request type run
// takes.
type tool struct {
	name   string
	desc   string
	failed string // how a failure reads: "Error <failed>: <message>"
	schema string // schemas/jsonschema/control/<schema>.json
	// The hints MCP clients read, beside the read-only one, which
	// schemas.ReadOnlyTools says: a tool that destroys work (close,
	// interrupt); one that a second call with the same arguments leaves as
	// the first did. Open, send and run act anew on every call that
	// carries no request_id, so they are not idempotent, though a retry
	// under the same request_id acts once.
	destructive, idempotent bool
	run                     func(ctx context.Context, c caller, args json.RawMessage) (any, error)
}

// about adapts an operation on a request about one agent (target names
// it; "" for none): the door judges the call, then op runs.
func about[Req, Rep any](m *MCP, name string, target func(Req) string, op func(context.Context, Req) (Rep, error)) func(context.Context, caller, json.RawMessage) (any, error) {
	return func(ctx context.Context, c caller, raw json.RawMessage) (any, error) {
		var req Req
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, fmt.Errorf("the arguments do not fit the request: %w", err)
		}
		if err := m.door(ctx, c, name, target(req)); err != nil {
			return nil, err
		}
		return op(ctx, req)
	}
}

func agentOf[Req interface{ Agent() string }](r Req) string { return r.Agent() }

func none[Req any](Req) string { return "" }

// tools are Kaimon's nine agent tools with its argument names, defaults
// and return shapes, plus agent_events and agent_nodes.
func (m *MCP) tools() []tool {
	f := m.f
	return []tool{
		{
			name: "agent_open", failed: "opening agent", schema: "open_request",
			desc: "Open a headless AI coding agent in a working directory and return its id; its events stream on NATS agent.<id> " +
				"and the Kaimon bus as agent:<id>. The model selects the backend: acp:<agent>[:<model>], ollama:<tag>, vmlx:<tag>, " +
				"anything else runs the claude CLI (a Claude model may carry an effort suffix, e.g. sonnet/high).",
			run: m.open,
		},
		{
			name: "agent_send", failed: "sending to agent", schema: "send_request",
			desc: "Write a user turn to an agent and return at once with the turn's number; a turn sent while another runs waits for it. " +
				"Events stream on agent:<id>.",
			run: about(m, "agent_send", agentOf[schemas.SendRequest], f.Send),
		},
		{
			name: "agent_run", failed: "running agent turn", schema: "run_request",
			desc: "Send a turn and block until it ends, returning the assistant's text, the turn and how it ended. " +
				"One synchronous run per agent at a time.",
			run: about(m, "agent_run", agentOf[schemas.RunRequest], m.run),
		},
		{
			name: "agent_output", failed: "reading agent output", schema: "output_request",
			desc: "Read an agent's output without blocking (partial while it still works): the last message of a turn, the " +
				"whole turn, or every turn. Works for agents whose node is gone, from the event stream.",
			run: about(m, "agent_output", agentOf[schemas.OutputRequest], f.Output),
		},
		{
			name: "agent_status", schema: "status_request",
			desc: "An agent's status: status, model, cwd, turn, timestamps, session id, transcript and event log paths, usage, and the node it runs on.",
			run: about(m, "agent_status", agentOf[schemas.StatusRequest], func(ctx context.Context, req schemas.StatusRequest) (schemas.AgentRecord, error) {
				rec, err := f.Status(ctx, req.AgentID)
				if schemas.CodeOf(err) == schemas.CodeNotFound {
					return rec, errors.New("No such agent: " + req.AgentID)
				}
				return rec, err
			}),
		},
		{
			name: "agent_list", failed: "listing agents", schema: "list_request",
			desc: "Every agent of the fabric, dead ones kept for review included, oldest first.",
			run: func(ctx context.Context, c caller, _ json.RawMessage) (any, error) {
				if err := m.door(ctx, c, "agent_list", ""); err != nil {
					return nil, err
				}
				recs, err := f.List(ctx)
				return schemas.ListReply{Agents: client.Visible(c.p, c.rec, recs)}, err
			},
		},
		{
			name: "agent_set_model", failed: "setting agent model", schema: "set_model_request", idempotent: true,
			desc: "Switch an agent to another model in place, keeping its conversation: an ACP agent takes acp:<agent>:<model> of " +
				"its own agent, a local-model agent a tag of its kind. Returns whether it switched.",
			// Kaimon's reply is {"switched": bool} exactly; the reason is
			// for Shoal's own clients.
			run: about(m, "agent_set_model", agentOf[schemas.SetModelRequest], func(ctx context.Context, req schemas.SetModelRequest) (schemas.SetModelReply, error) {
				rep, err := f.SetModel(ctx, req)
				rep.Reason = ""
				return rep, err
			}),
		},
		{
			name: "agent_interrupt", failed: "interrupting agent", schema: "agent_request", destructive: true, idempotent: true,
			desc: "Cancel an agent's running turn, and the turns sent behind it; each ends with stop reason cancelled. Returns whether anything was interrupted.",
			run:  about(m, "agent_interrupt", agentOf[schemas.AgentRequest], f.Interrupt),
		},
		{
			name: "agent_close", failed: "closing agent", schema: "agent_request", destructive: true, idempotent: true,
			desc: "Close an agent: stop its process and everything it started. It is kept as dead for review. false for an unknown id.",
			run:  about(m, "agent_close", agentOf[schemas.AgentRequest], f.Close),
		},
		{
			name: "agent_events", failed: "reading agent events", schema: "events_request",
			desc: "Replay an agent's stored events (a Shoal addition): from the start, from an event number, a turn or a time, " +
				"a page at a time. next_event continues the read; gaps in the numbering are reported.",
			run: about(m, "agent_events", agentOf[schemas.EventsRequest], f.Events),
		},
		{
			name: "agent_nodes", failed: "listing nodes", schema: "nodes_request",
			desc: "The nodes of the fabric and what each can run (a Shoal addition).",
			run: about(m, "agent_nodes", none[schemas.NodesRequest], func(ctx context.Context, _ schemas.NodesRequest) (schemas.NodesReply, error) {
				nodes, err := f.Nodes(ctx)
				if nodes == nil {
					nodes = []schemas.NodeRecord{}
				}
				return schemas.NodesReply{Nodes: nodes}, err
			}),
		},
		{
			// A second answer acts on nothing: it is told who answered.
			name: "agent_permit", failed: "answering a permission request", schema: "permit_request", idempotent: true,
			desc: "Answer a permission request an agent opened with permission ask waits on (a Shoal addition): allow lets the " +
				"tool run, deny refuses it with your message. Only the first answer counts; a later one is a conflict naming it.",
			run: func(ctx context.Context, c caller, raw json.RawMessage) (any, error) {
				var req schemas.PermitRequest
				if err := json.Unmarshal(raw, &req); err != nil {
					return nil, err
				}
				if err := m.door(ctx, c, "agent_permit", req.AgentID); err != nil {
					return nil, err
				}
				req.By = "mcp"
				if c.rec != nil {
					req.By = "agent " + c.rec.ID
					if d, _ := schemas.ParseDecision(string(req.Decision)); d == schemas.DecisionAllow {
						if err := m.approves(ctx, *c.rec, req); err != nil {
							return nil, err
						}
					}
				}
				return f.Permit(ctx, req)
			},
		},
		{
			name: "agent_diff", failed: "reading agent diff", schema: "diff_request",
			desc: "The work of an agent opened on a repository (repo in agent_open), as git diff prints it against the commit it " +
				"started on: its commits and what it has not committed, untracked files included (a Shoal addition). stat: a summary.",
			run: about(m, "agent_diff", agentOf[schemas.DiffRequest], func(ctx context.Context, req schemas.DiffRequest) (schemas.DiffReply, error) {
				r, err := m.repos()
				if err != nil {
					return schemas.DiffReply{}, err
				}
				return r.Diff(ctx, req.AgentID, req.Stat)
			}),
		},
		{
			// A second fetch of unchanged work leaves the branch as the
			// first did.
			name: "agent_fetch", failed: "fetching agent work", schema: "fetch_request", idempotent: true,
			desc: "Bring the work of an agent opened on a repository back as branch shoal/<id> of the repository it was opened on " +
				"(or into, a directory of another's work tree), on this endpoint's machine: its commits and, on top, a commit of what " +
				"it has not committed. The checkout, index and HEAD there are not touched (a Shoal addition).",
			run: func(ctx context.Context, c caller, raw json.RawMessage) (any, error) {
				var req schemas.FetchRequest
				if err := json.Unmarshal(raw, &req); err != nil {
					return nil, fmt.Errorf("the arguments do not fit the request: %w", err)
				}
				if err := m.door(ctx, c, "agent_fetch", req.AgentID); err != nil {
					return nil, err
				}
				if req.Into != "" && !filepath.IsAbs(req.Into) {
					return nil, schemas.Errf(schemas.CodeInvalid, "into %q is not an absolute path", req.Into)
				}
				r, err := m.repos()
				if err != nil {
					return nil, err
				}
				return r.Fetch(ctx, req.AgentID, req.Into, req.Force)
			},
		},
		{
			name: "agent_job", failed: "running job", schema: "job_request",
			desc: "Run a job (a Shoal addition): open an agent on the repository at cwd on this endpoint's machine, on whichever node " +
				"placement chooses, run prompt and then each of then, bring its work back as branch shoal/<job> there, close the agent, " +
				"and return the job: status (succeeded or failed, with error), turns done, branch, tip, diff stat and usage. With detach " +
				"it returns at once, running; agent_job with job_id alone waits for a job and returns it as it ended.",
			run: m.job,
		},
		{
			name: "agent_pending", failed: "listing permission requests", schema: "pending_request",
			desc: "The permission requests agents wait on, oldest first, with each tool call's input (a Shoal addition).",
			run: func(ctx context.Context, c caller, _ json.RawMessage) (any, error) {
				if err := m.door(ctx, c, "agent_pending", ""); err != nil {
					return nil, err
				}
				all, err := f.Pending(ctx)
				if err != nil {
					return nil, err
				}
				rep := schemas.PendingReply{Requests: m.readable(ctx, c, all.Requests)}
				if c.p.Kind == schemas.KindPerson {
					// An agent sees only what it may read, and no count
					// of the others.
					rep.Omitted = all.Omitted
				}
				return rep, nil
			},
		},
	}
}

// open opens an agent. An agent's open passes its door: its policy, the
// paths it passes confined to its workspace, and its child no wider than
// itself. A person may grant the agent a reach; an agent's child has no
// more than its parent.
func (m *MCP) open(ctx context.Context, c caller, raw json.RawMessage) (any, error) {
	var req schemas.OpenRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, fmt.Errorf("the arguments do not fit the request: %w", err)
	}
	if err := m.door(ctx, c, "agent_open", ""); err != nil {
		return nil, err
	}
	if req.Repo {
		if err := client.Authorize(ctx, m.f, c.p, c.rec, schemas.AccessFiles, "", "open agents on a repository"); err != nil {
			if schemas.CodeOf(err) == schemas.CodeForbidden {
				return nil, refused("%s", err.Error())
			}
			return nil, err
		}
		r, err := m.repos()
		if err != nil {
			return nil, err
		}
		if !filepath.IsAbs(req.CWD) {
			return nil, schemas.Errf(schemas.CodeInvalid, "cwd %q is not an absolute path: with repo it names a repository of the coordinator's machine", req.CWD)
		}
		src := client.RepoSource{Dir: req.CWD, Ref: req.Ref, WithChanges: req.WithChanges}
		return r.OpenRepo(ctx, req, src)
	}
	if req.Ref != "" || req.WithChanges {
		return nil, schemas.Errf(schemas.CodeInvalid, "ref and with_changes go with repo: true")
	}
	if c.rec != nil {
		local, err := confine(c.rec, &req.CWD, &req.MCPConfig)
		if err != nil {
			return nil, err
		}
		if err := m.nested(*c.rec, &req); err != nil {
			return nil, err
		}
		req.Within = c.rec.Policy.CWD // held to it again where the child runs
		sandboxed := c.rec.Sandbox != nil
		if sandboxed {
			if req.Beneath, err = m.familyRoot(ctx, *c.rec); err != nil {
				return nil, err
			}
			if err := m.holdsBeneath(ctx, *c.rec, req.CWD); err != nil {
				return nil, err
			}
		}
		// An agent's children run on its node: the same path on another
		// node is another directory, which the parent never had, and a
		// child there would run as that node's user, with its files (its
		// credentials, its agents' tokens), where the parent runs as its
		// own node's user or in a sandbox.
		switch {
		case req.Node == "":
			req.Node = c.rec.Node
		case req.Node != c.rec.Node && sandboxed:
			return nil, refused("agent %s runs sandboxed on node %s: its children run there too, not on node %s", c.rec.ID, c.rec.Node, req.Node)
		case req.Node != c.rec.Node && local:
			return nil, refused("path %s is on node %s alone, where agent %s works: its child may not be placed on node %s", req.CWD, c.rec.Node, c.rec.ID, req.Node)
		case req.Node != c.rec.Node:
			return nil, refused("agent %s may not place its child on node %s: it runs on node %s, as that node's user, and its children run there too (the same path on another node is another directory, under another user)", c.rec.ID, req.Node, c.rec.Node)
		}
		// The id it opens under, named now: with none given it is the
		// request id's, which the caller chooses as freely as an id.
		client.NameOpen(&req)
		if err := m.reopens(ctx, c, req.ID); err != nil {
			return nil, err
		}
	}
	return m.f.Open(ctx, req)
}

// run runs a turn. A call that asked for progress hears of each of the
// turn's events as it is stored (its echo, a text, a tool call or result,
// a thought; not the streamed chunks), as notifications/progress counting
// them, until the turn ends.
func (m *MCP) run(ctx context.Context, req schemas.RunRequest) (schemas.RunReply, error) {
	report := progressOf(ctx)
	if report == nil {
		return m.f.Run(ctx, req)
	}
	from := client.From{Time: time.Now()} // what this turn stores from now on
	watch, stop := context.WithCancel(ctx)
	var watching sync.WaitGroup
	ended := make(chan struct{}) // the turn's result was reported
	var reported atomic.Int64
	watching.Go(func() {
		// The run's turn is known by its echo (its text, numbered as the
		// turn before it): what another turn stores meanwhile, one running
		// when the call came or sent beside it, is not the run's.
		n, turn := 0, -1
		m.f.Replay(watch, []string{req.AgentID}, from, true, func(r client.Replayed, _ *client.Gap) error {
			if r.Delta || r.Stray != "" {
				return nil
			}
			switch {
			case turn < 0 && r.Kind == schemas.KindUserText && echoes(r, req.Text):
				turn = r.Turn + 1
			case r.Turn != turn:
				return nil
			}
			n++
			report(float64(n), string(r.Kind))
			reported.Add(1)
			if r.Kind == schemas.KindResult {
				close(ended)
				return errStopReplay
			}
			return nil
		})
	})
	defer func() { stop(); watching.Wait() }()
	rep, err := m.f.Run(ctx, req)
	if err == nil {
		// The result is stored before the run answers; let its progress
		// out before the reply.
		select {
		case <-ended:
			awaitProgress(ctx, reported.Load(), 2*time.Second)
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
	}
	return rep, err
}

// echoes reports whether r, a user_text event, echoes text.
func echoes(r client.Replayed, text string) bool {
	ev, err := r.Event()
	if err != nil {
		return false
	}
	u, ok := ev.Payload.(schemas.UserText)
	return ok && u.Content.Text == text
}

// errStopReplay ends a replay from its callback.
var errStopReplay = errors.New("the turn ended")

// job runs a job (agent_job), or waits for one.
func (m *MCP) job(ctx context.Context, c caller, raw json.RawMessage) (any, error) {
	var req schemas.JobRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, fmt.Errorf("the arguments do not fit the request: %w", err)
	}
	if err := m.door(ctx, c, "agent_job", req.JobID); err != nil {
		return nil, err
	}
	r, err := m.repos()
	if err != nil {
		return nil, err
	}
	if req.JobID != "" {
		if req.CWD != "" || req.Prompt != "" || len(req.Then) > 0 || req.Detach {
			return nil, schemas.Errf(schemas.CodeInvalid, "job_id waits for a job: give it alone")
		}
		return r.WaitJob(ctx, req.JobID)
	}
	switch {
	case req.CWD == "":
		return nil, schemas.Errf(schemas.CodeInvalid, "a job needs cwd, the repository it works on")
	case !filepath.IsAbs(req.CWD):
		return nil, schemas.Errf(schemas.CodeInvalid, "cwd %q is not an absolute path", req.CWD)
	case strings.TrimSpace(req.Prompt) == "":
		return nil, schemas.Errf(schemas.CodeInvalid, "a job needs a prompt")
	}
	spec := client.JobSpec{
		Open:        schemas.OpenRequest{Model: req.Model, Permission: req.Permission, Node: req.Node, Labels: req.Labels, Sandbox: req.Sandbox},
		Source:      client.RepoSource{Dir: req.CWD, Ref: req.Ref, WithChanges: req.WithChanges},
		Turns:       append([]string{req.Prompt}, req.Then...),
		TurnTimeout: time.Duration(req.Timeout * float64(time.Second)),
	}
	if !req.Detach {
		job, err := r.RunJob(ctx, spec)
		if job.ID == "" {
			return nil, err // it never began
		}
		return job, nil // its status and error say how it ended
	}
	// Detached, the job outlives the call: it runs until it ends, or
	// this endpoint's process does, counted among its caller's calls
	// under way until then.
	started := make(chan string, 1)
	failed := make(chan error, 1)
	spec.Started = func(id string) { started <- id }
	release := keepCall(ctx)
	go func() {
		defer release()
		job, err := r.RunJob(context.WithoutCancel(ctx), spec)
		if job.ID == "" {
			failed <- err
		}
	}()
	select {
	case id := <-started:
		return r.Job(ctx, id)
	case err := <-failed:
		return nil, err
	}
}

// repos is the client as a client.Repositories, or why it is not one.
func (m *MCP) repos() (client.Repositories, error) {
	r, ok := m.f.(client.Repositories)
	if !ok {
		return nil, schemas.Errf(schemas.CodeForbidden, "repositories need the coordinator's credentials: this MCP server's client is scoped (its credentials do not reach the repositories' object store); use the coordinator's endpoint")
	}
	return r, nil
}

// reopens holds an agent's open of an id to its own subtree: a fresh id,
// or a dead agent it reaches. Reopening any other id would give it that
// agent's stream, every earlier life of it, and the lineage of its
// children (who name the id as their parent).
func (m *MCP) reopens(ctx context.Context, c caller, id string) error {
	switch _, err := m.f.Record(ctx, id); {
	case schemas.CodeOf(err) == schemas.CodeNotFound:
		page, err := m.f.Events(ctx, schemas.EventsRequest{AgentID: id, Max: 1})
		switch {
		case schemas.CodeOf(err) == schemas.CodeNotFound, err == nil && len(page.Events) == 0:
			return m.orphans(ctx, c, id)
		case err != nil:
			return err
		}
		// A pruned agent's stream, with no record to tell its lineage by:
		// Authorize finds it outside the caller's reach.
	case err != nil:
		return err
	}
	if err := client.Authorize(ctx, m.f, c.p, c.rec, schemas.AccessAct, id, "reopen"); err != nil {
		return refused("%s", err.Error())
	}
	return nil
}

// permitRecordWaits are how long an agent's allow waits, between reads
// of the requests waiting, for the record of a request it heard of: a
// node writes it right after it tells of the request. Each read lists
// every request waiting, so there are few of them.
var permitRecordWaits = []time.Duration{100 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond}

// approves holds an agent's allow of a descendant's permission request
// to what its own allowlist approves.
//
// A request is judged by its record, which says its tool. A node tells
// of a request on the agent's stream before it writes the record, so an
// allow that comes first waits a moment for it; one whose record does
// not come (never asked, or its node's write failed) allows nothing a
// tool could be checked for, and only a parent that may allow any tool
// may answer it so.
func (m *MCP) approves(ctx context.Context, self schemas.AgentRecord, req schemas.PermitRequest) error {
	var pol schemas.AgentPolicy // none on record approves nothing
	if self.Policy != nil {
		pol = *self.Policy
	}
	var asked *schemas.PermitRecord
	for try := 0; asked == nil; try++ {
		all, err := m.f.Pending(ctx)
		if err != nil {
			return err
		}
		pending := all.Requests
		if i := slices.IndexFunc(pending, func(r schemas.PermitRecord) bool { return r.AgentID == req.AgentID && r.RequestID == req.RequestID }); i >= 0 {
			asked = &pending[i]
			break
		}
		if pol.Preset == schemas.PresetBypass {
			return nil // it may allow anything: Permit says whether the request is there
		}
		if try == len(permitRecordWaits) {
			if all.Omitted > 0 {
				return refused("agent %s may not allow agent %s's request %s: it is not among the requests listed (%d more wait than one reply of the fabric service holds), so the tool it would allow cannot be held to this agent's allowlist; a person may answer it", self.ID, req.AgentID, req.RequestID, all.Omitted)
			}
			return refused("agent %s may not allow agent %s's request %s: no such request is waiting, so the tool it would allow cannot be held to this agent's allowlist", self.ID, req.AgentID, req.RequestID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(permitRecordWaits[try]):
		}
	}
	// Names are matched in their case only between two claude agents,
	// whose CLIs both match them so; where either is judged by Shoal (an
	// ACP agent, a local model), in any case, as Shoal's judge does.
	anyCase := true
	if mine, _ := schemas.Route(self.Model); mine == schemas.BackendClaude {
		rec, err := m.f.Status(ctx, req.AgentID)
		if err != nil {
			return err
		}
		theirs, _ := schemas.Route(rec.Model)
		anyCase = theirs != schemas.BackendClaude
	}
	if err := pol.Approves(asked.Tool, anyCase); err != nil {
		return refused("agent %s may not allow agent %s's %s: %s", self.ID, req.AgentID, asked.Tool, err.Error())
	}
	return nil
}

// orphans holds an agent's open of an id with no record and no stream to
// what records still name the id as their parent: a dead agent's record
// is forgotten once its node keeps enough newer dead ones, and its
// events leave the stream by age or size, while its children live on.
// The id is their lineage, not fresh: whoever opened under it would
// have them as its children. With the record gone nothing shows the id
// to be of the caller's tree, so it is judged as not of it.
func (m *MCP) orphans(ctx context.Context, c caller, id string) error {
	recs, err := m.f.List(ctx)
	if err != nil {
		return err
	}
	var kids []string
	for _, r := range recs {
		if r.Parent == id {
			kids = append(kids, r.ID)
		}
	}
	if len(kids) == 0 {
		return nil // never used: no record, no stream, no children
	}
	t := schemas.Target{Agent: id, Rel: schemas.RelUnrelated}
	if err := schemas.Decide(c.p, schemas.AccessAct, t).Err(c.p, "reopen", t); err != nil {
		return refused("%s (its record is gone, and agents %s name it as their parent)", err.Error(), strings.Join(kids, ", "))
	}
	return nil
}

// readable keeps the permission requests of the agents c may read.
func (m *MCP) readable(ctx context.Context, c caller, reqs []schemas.PermitRecord) []schemas.PermitRecord {
	out := []schemas.PermitRecord{}
	for _, r := range reqs {
		if c.p.Kind == schemas.KindPerson || client.Authorize(ctx, m.f, c.p, c.rec, schemas.AccessRead, r.AgentID, "read") == nil {
			out = append(out, r)
		}
	}
	return out
}
