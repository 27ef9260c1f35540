package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/workspace"
)

// Agents on a caller's repository (shoal open --repo). The client makes
// the agent's start on the caller's machine (a commit of a ref, or of the
// uncommitted work, without touching the caller's checkout), asks the
// node placement chose what it has of the repository, and sends a bundle
// of the rest through the fabric's object store; the node checks out the
// agent's own copy from it. The agent's work comes back the same way.

// RepoSource is the caller's repository an agent is opened on.
type RepoSource struct {
	Dir         string // a directory of the caller's git work tree
	Ref         string // what the agent starts on: HEAD when empty
	WithChanges bool   // start on the uncommitted work, on top of HEAD
}

// DefaultMaxBundle is the largest bundle sent to a node unless
// Config.MaxBundle says otherwise: a repository whose commits the node
// lacks take more is refused before anything is sent.
const DefaultMaxBundle = 2 << 30

// OpenRepo opens an agent on the caller's repository src: on a node with
// git, in a checkout of its own on branch shoal/<id>. Only what the node
// lacks of the start's history is sent.
func (f *Direct) OpenRepo(ctx context.Context, req schemas.OpenRequest, src RepoSource) (schemas.OpenReply, error) {
	if err := repoOpenAllowed(req); err != nil {
		return schemas.OpenReply{}, err
	}
	if err := f.reopensAsItWas(ctx, req.ID, src); err != nil {
		return schemas.OpenReply{}, err
	}
	start, err := prepareRepo(ctx, src)
	if err != nil {
		return schemas.OpenReply{}, err
	}
	defer start.Close()
	f.sayLeftOut(start)
	return f.openPrepared(ctx, req, start)
}

// sayLeftOut says what of the caller's uncommitted work its agent starts
// without (the commit of it names it too, which the caller never sees).
func (f *Direct) sayLeftOut(start *workspace.Start) {
	for _, l := range start.LeftOut {
		f.say("left out of your uncommitted work, %s", l)
	}
}

// reopensAsItWas refuses a reopen of agent id, whose work goes on in its
// own checkout, that asks for another start: the caller's uncommitted
// work, or a ref. Neither would be taken.
func (f *Direct) reopensAsItWas(ctx context.Context, id string, src RepoSource) error {
	if id == "" || (!src.WithChanges && src.Ref == "") {
		return nil
	}
	rec, err := f.Record(ctx, id)
	if err != nil || rec.Workspace == nil || rec.Status != schemas.StatusDead {
		return nil // a new id, or one in use, which the open refuses
	}
	what := "with_changes (--with-changes)"
	if src.Ref != "" {
		what = "ref (--ref)"
	}
	return schemas.Errf(schemas.CodeInvalid, "agent %s goes on in its own checkout, its work as it left it (node %s, branch %s): a reopen takes no %s; leave it out, or give this agent another id for a fresh start", id, rec.Node, schemas.BranchName(id), what)
}

// repoOpenAllowed refuses an open on the caller's repository that sets
// what is Shoal's, or comes from an agent.
func repoOpenAllowed(req schemas.OpenRequest) error {
	if req.Workspace != nil {
		return schemas.Errf(schemas.CodeInvalid, "workspace is Shoal's to set")
	}
	if req.Parent != "" {
		return schemas.Errf(schemas.CodeForbidden, "an agent may not open an agent on a repository of the caller's machine; open it on a directory")
	}
	return nil
}

// prepareRepo finds the caller's repository src names and the commit its
// agent starts on (workspace.Prepare), its errors said as the fabric's.
func prepareRepo(ctx context.Context, src RepoSource) (*workspace.Start, error) {
	start, err := workspace.Prepare(ctx, src.Dir, src.Ref, src.WithChanges)
	if err != nil {
		code := schemas.CodeInvalid
		if errors.Is(err, workspace.ErrNoGit) {
			code = schemas.CodeUnavailable
		}
		return nil, schemas.Errf(code, "%v", err)
	}
	if !utf8.ValidString(start.Root) {
		// The agent's record, JSON, keeps it as text: such a path comes
		// back as another, and a fetch would land elsewhere or nowhere.
		start.Close()
		return nil, schemas.Errf(schemas.CodeInvalid, "the repository's path %q is not valid UTF-8, which an agent's record cannot keep: rename it, or open on a copy whose path is", start.Root)
	}
	return start, nil
}

// openPrepared is OpenRepo once the repository is prepared.
func (f *Direct) openPrepared(ctx context.Context, req schemas.OpenRequest, start *workspace.Start) (schemas.OpenReply, error) {
	if err := repoOpenAllowed(req); err != nil {
		return schemas.OpenReply{}, err
	}
	// The start says what the request's own repo fields would.
	req.Repo, req.Ref, req.WithChanges = false, "", false
	req.CWD = start.Root
	// A reopened id goes on with its work: where it was, or carried from
	// there to the node placement chooses.
	var prev *schemas.AgentRecord
	if req.ID != "" {
		if rec, err := f.Record(ctx, req.ID); err == nil && rec.Workspace != nil {
			if rec.Workspace.Repo != start.Repo {
				return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent %s works on another repository (%s, from %s); give this agent another id", req.ID, rec.Workspace.Repo, rec.Workspace.Source)
			}
			if rec.Status == schemas.StatusIdle || rec.Status == schemas.StatusWorking {
				// Said before its work is asked of its node and carried:
				// the claim would refuse it after.
				return schemas.OpenReply{}, schemas.Errf(schemas.CodeConflict, "agent id already in use: %s (it lives on node %s; close it first, or give this agent another id)", req.ID, rec.Node)
			}
			prev = &rec
			if req.Node == "" {
				if nodes, err := f.Nodes(ctx); err == nil && slices.ContainsFunc(nodes, func(n schemas.NodeRecord) bool { return n.Name == rec.Node }) {
					req.Node = rec.Node // where its checkout is, if that node runs
				}
			}
		}
	}
	return f.open(ctx, req, func(ctx context.Context, node string) (*schemas.Workspace, error) {
		if prev != nil {
			return f.move(ctx, start, *prev, node)
		}
		return f.ship(ctx, start, node)
	})
}

// move is the workspace of a reopened agent on node: on the node it ran
// on, its checkout there; on another, its work there carried over (its
// commits and a commit of what it had not committed), beyond what node
// holds.
func (f *Direct) move(ctx context.Context, start *workspace.Start, prev schemas.AgentRecord, node string) (*schemas.Workspace, error) {
	ws := *prev.Workspace
	ws.Source, ws.Bundle, ws.Resume = start.Root, "", ""
	if node == prev.Node {
		return &ws, nil
	}
	var has schemas.RepoHasReply
	if err := f.request(ctx, node, schemas.VerbRepoHas, schemas.RepoHasRequest{Repo: ws.Repo, Commit: ws.Commit}, &has, f.timeout); err != nil {
		return nil, err
	}
	haves := has.Haves
	if has.Has {
		haves = append(haves, ws.Commit)
	}
	var work schemas.WorkReply
	excludes, err := workspace.CallerExcludes(ctx, start.Root, schemas.MaxExcludesBytes)
	if err != nil {
		f.say("%v", err)
	}
	req := schemas.WorkRequest{AgentID: prev.ID, Haves: haves, Whole: len(haves) == 0, Excludes: excludes}
	err = f.request(ctx, prev.Node, schemas.VerbWork, req, &work, 10*time.Minute)
	if knowsNoExcludes(err) {
		f.say("node %s is of an earlier version, which cannot leave out what your git ignores: agent %s's work is carried with it", prev.Node, prev.ID)
		req.Excludes = ""
		err = f.request(ctx, prev.Node, schemas.VerbWork, req, &work, 10*time.Minute)
	}
	if err != nil {
		return nil, anyNode{schemas.Errf(schemas.CodeOf(err), "agent %s's work is on node %s, which could not send it (%v): reopen it when %s answers, or open a new agent", prev.ID, prev.Node, err, prev.Node)}
	}
	if err := workBundle(prev.ID, prev.Node, ws.Repo, work.Bundle); err != nil {
		return nil, err
	}
	ws.Resume, ws.Bundle = work.Tip, work.Bundle
	f.say("carried agent %s's work (%s, %s changed) from node %s to node %s", prev.ID, counted(work.Commits, "commit"), counted(work.Files, "file"), prev.Node, node)
	return &ws, nil
}

// workBundle refuses a node's answer naming a bundle that is not of its
// agent's work (schemas.WorkBundlePrefix): a node may name only what it
// wrote, not another agent's bundle for the caller to land or for the
// agent's next node to check out.
func workBundle(id, node, repo, name string) error {
	if name == "" || strings.HasPrefix(name, schemas.WorkBundlePrefix(repo, node, id)) {
		return nil
	}
	return schemas.Errf(schemas.CodeInternal, "agent %s's node %s named bundle %s, which is not of its work (%s…; a node of an earlier version names its work otherwise: upgrade it): nothing was taken", id, node, name, schemas.WorkBundlePrefix(repo, node, id))
}

// checkoutOn is agent id's checkout on node, as the node's record says;
// "" when it does not say.
func checkoutOn(nodes []schemas.NodeRecord, node, id string) string {
	for _, n := range nodes {
		if n.Name == node && n.Checkouts != "" {
			return filepath.Join(n.Checkouts, id)
		}
	}
	return ""
}

// gitNodes keeps the nodes that can run an agent on a repository; the
// node an open names must be one.
func gitNodes(nodes *[]schemas.NodeRecord, named string) error {
	if named != "" {
		for _, n := range *nodes {
			if n.Name == named && n.Git == "" {
				return schemas.Errf(schemas.CodeUnavailable, "node %s has no git, so it cannot run an agent on a repository", named)
			}
		}
	}
	all := len(*nodes)
	*nodes = slices.DeleteFunc(*nodes, func(n schemas.NodeRecord) bool { return n.Git == "" })
	if all > 0 && len(*nodes) == 0 {
		return schemas.Errf(schemas.CodeUnavailable, "no node has git, so none can run an agent on a repository (%d running)", all)
	}
	return nil
}

// ship sends node what it lacks of start and returns the workspace the
// open carries.
func (f *Direct) ship(ctx context.Context, start *workspace.Start, node string) (*schemas.Workspace, error) {
	ws := &schemas.Workspace{Repo: start.Repo, Source: start.Root, Ref: start.Ref, Base: start.Base, Commit: start.Commit, WithChanges: start.Commit != start.Base}
	var has schemas.RepoHasReply
	if err := f.request(ctx, node, schemas.VerbRepoHas, schemas.RepoHasRequest{Repo: start.Repo, Commit: start.Commit}, &has, f.timeout); err != nil {
		return nil, err
	}
	if has.Has {
		f.say("node %s has commit %.12s of %s already: nothing to send", node, start.Commit, start.Root)
		return ws, nil
	}
	obs, err := f.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "the repositories' object store: %v", err)
	}
	ws.Bundle = schemas.BundleName(start.Repo, start.Commit, has.Haves)
	if info, err := obs.GetInfo(ctx, ws.Bundle); err == nil && !info.Deleted {
		// Sent whole before: by an earlier try, or for another node that
		// held what this one holds.
		f.say("the commits node %s lacks of %s were sent before (%d bytes): not sent again", node, start.Root, info.Size)
		return ws, nil
	}
	// In a directory of its own, all of which goes however the bundling
	// ends: git writes the bundle to a lock file beside it first, which
	// an interrupt (Ctrl-C, a cancelled call) left behind, as large as
	// what it had bundled.
	dir, err := os.MkdirTemp("", "shoal-bundle-")
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	defer os.RemoveAll(dir)
	tmp, err := os.Create(filepath.Join(dir, "bundle"))
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	tmp.Close()
	// git builds the bundle before a byte is sent: minutes, for a large
	// repository of objects not yet packed, which are said as they pass.
	bundling := time.Now()
	stop := f.ticking(fmt.Sprintf("bundling what node %s lacks of %s", node, start.Root))
	commits, err := start.Bundle(ctx, has.Haves, tmp.Name())
	stop()
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "bundle %s: %v", start.Root, err)
	}
	if commits == 0 {
		// The node holds every commit but not the ref: nothing to send
		// that it could not have, so the start itself is asked again.
		return nil, schemas.Errf(schemas.CodeInternal, "node %s lacks commit %s of %s, yet has all its history", node, start.Commit, start.Root)
	}
	in, err := os.Open(tmp.Name())
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return nil, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	if fi.Size() > f.maxBundle {
		if names, sizes, _ := start.Largest(ctx, 3); len(names) > 0 {
			// Most often a file left untracked and unignored (a core
			// dump, a data set), taken with the uncommitted work.
			largest := make([]string, len(names))
			for i := range names {
				largest[i] = fmt.Sprintf("%s (%s)", names[i], bytesText(sizes[i]))
			}
			return nil, schemas.Errf(schemas.CodeInvalid, "%s is too large to send: node %s lacks %s of it with your uncommitted work, %s as a bundle, past the limit of %s; the largest files of your uncommitted work are %s: ignore or remove what should not go, or open the agent on a directory of the node instead",
				start.Root, node, counted(commits, "commit"), bytesText(fi.Size()), bytesText(f.maxBundle), strings.Join(largest, ", "))
		}
		return nil, schemas.Errf(schemas.CodeInvalid, "%s is too large to send: node %s lacks %s of it, %s as a bundle, past the limit of %s; open the agent on a directory of the node instead",
			start.Root, node, counted(commits, "commit"), bytesText(fi.Size()), bytesText(f.maxBundle))
	}
	if f.progress != nil {
		f.say("bundled %s of %s: %s in %s", counted(commits, "commit"), start.Root, bytesText(fi.Size()), time.Since(bundling).Round(time.Millisecond))
	}
	what := fmt.Sprintf("%s of %s to node %s", counted(commits, "commit"), start.Root, node)
	began := time.Now()
	r := &countingReader{r: in}
	done := f.report(r, fi.Size(), "sending "+what)
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: ws.Bundle, Description: "commits of " + start.Root + " for node " + node}, r)
	done()
	if err != nil {
		// A bundle cut off is never read: the node reads only a whole
		// object, whose digest it checks. A retry sends it again.
		obs.Delete(context.WithoutCancel(ctx), ws.Bundle)
		if ReposFull(err) {
			return nil, anyNode{schemas.Errf(schemas.CodeUnavailable, "send %s: the repositories' store %s has no room for %s more (its bound: shoal up --repos-max-bytes; bundles are kept %s)",
				what, schemas.ReposBucket, bytesText(fi.Size()), reposKept)}
		}
		// The store is the coordinator's, whichever node was to read
		// it: another node would meet the same.
		if !f.nc.IsConnected() || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, syscall.ECONNRESET) {
			return nil, anyNode{schemas.Errf(schemas.CodeUnavailable, "send %s: the connection to the fabric went while it was sent (%v): is shoal up running? Open it again once it is: what was sent whole is not sent again", what, err)}
		}
		return nil, anyNode{schemas.Errf(schemas.CodeUnavailable, "send %s: the repositories' store %s did not take it: %v (the coordinator's store may be failing writes, its disk full: its log says; once mended, shoal up may need a restart)", what, schemas.ReposBucket, err)}
	}
	f.say("sent %s: %d bytes in %s", what, fi.Size(), time.Since(began).Round(time.Millisecond))
	return ws, nil
}

// reposKept is how long the repositories' store keeps a bundle
// (broker.ReposTTL), for messages.
const reposKept = "24 hours"

// ReposFull reports whether err is JetStream's refusal of a write to the
// repositories' store that would pass its bound (MaxBytes).
func ReposFull(err error) bool {
	apiErr, ok := errors.AsType[*jetstream.APIError](err)
	return ok && apiErr.ErrorCode == errCodeStoreFailed && strings.Contains(apiErr.Description, "maximum bytes")
}

// errCodeStoreFailed is JetStream's error code for a write the stream's
// store refused (nats-server's JSStreamStoreFailedF).
const errCodeStoreFailed jetstream.ErrorCode = 10077

// GetObject opens object name of obs for reading. Opening it is a few API
// requests of the server's, each bounded by nats.go to five seconds when
// ctx has no deadline of its own: on a server busy past that (a 48 MB
// bundle written while a node restarts, on a loaded machine) one timed
// out and the whole fetch failed, so a timed-out open is tried again,
// three times in all, while ctx lasts.
func GetObject(ctx context.Context, obs jetstream.ObjectStore, name string) (jetstream.ObjectResult, error) {
	for try := 1; ; try++ {
		obj, err := obs.Get(ctx, name)
		if err == nil || try == 3 || !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return obj, err
		}
	}
}

// StoreBundleError is why storing bundle name in the repositories' store
// failed with err: the store is full, saying which bound, or err.
func StoreBundleError(name string, err error) error {
	if ReposFull(err) {
		return schemas.Errf(schemas.CodeUnavailable, "store bundle %s: the repositories' store %s is full (its bound: shoal up --repos-max-bytes)", name, schemas.ReposBucket)
	}
	return schemas.Errf(schemas.CodeUnavailable, "store bundle %s: %v", name, err)
}

// anyNode is an open's failure that no other node would avoid: the
// repositories' store with no room, or refusing a write otherwise; a
// reopened agent's work on a node that cannot send it. Placement does not
// go on to another node with it.
type anyNode struct{ *schemas.ControlError }

func (e anyNode) Unwrap() error { return e.ControlError }

// say tells the caller's progress line, if it has one.
func (f *Direct) say(format string, args ...any) {
	if f.progress != nil {
		f.progress(fmt.Sprintf(format, args...))
	}
}

// report says every few seconds how much of size r has read, until done
// is called.
func (f *Direct) report(r *countingReader, size int64, what string) (done func()) {
	if f.progress == nil {
		return func() {}
	}
	f.say("%s: %s", what, bytesText(size))
	last, moved := int64(-1), time.Now()
	return every(2*time.Second, func() {
		n := r.n.Load()
		line := fmt.Sprintf("%s: %s of %s (%d%%)", what, bytesText(n), bytesText(size), n*100/max(size, 1))
		if n == last {
			// The same line again would read as a line printed twice.
			line += fmt.Sprintf(", nothing more for %s", time.Since(moved).Round(time.Second))
		} else {
			last, moved = n, time.Now()
		}
		f.say("%s", line)
	})
}

// ticking says what begins, and then every tickEvery how long it has
// taken, until the returned func is called; nothing without progress.
func (f *Direct) ticking(what string) (done func()) {
	if f.progress == nil {
		return func() {}
	}
	f.say("%s…", what)
	began := time.Now()
	return every(tickEvery, func() { f.say("%s: %s so far", what, time.Since(began).Round(time.Second)) })
}

// waitingFor says, once a wait has taken tickEvery and then every
// tickEvery until the returned func is called, that it waits for what and
// how long it has; while the caller's connection to the fabric is away,
// that the fabric is, and, with again, that the request goes again once
// it is back. Nothing for a wait that ends sooner, nor without progress.
func (f *Direct) waitingFor(what string, again bool) (done func()) {
	if f.progress == nil {
		return func() {}
	}
	began := time.Now()
	return every(tickEvery, func() {
		line := fmt.Sprintf("waiting for %s: %s so far", what, time.Since(began).Round(time.Second))
		switch {
		case f.nc.IsConnected():
		case again:
			line += " (the fabric is away: the request goes again once it is back)"
		default:
			line += " (the fabric is away)"
		}
		f.say("%s", line)
	})
}

// tickEvery is how often ticking says how long what it follows has taken.
const tickEvery = 5 * time.Second

// every calls fn every d, on a goroutine of its own, until stop is
// called; stop returns once fn is no longer running.
func every(d time.Duration, fn func()) (stop func()) {
	quit := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return func() { close(quit); <-ended }
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// bytesText is a size as people read it.
func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// counted is n and word, with an s but for one.
func counted(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// knowsNoExcludes reports whether err is a node's refusal of a work
// request's excludes, which its version does not know.
func knowsNoExcludes(err error) bool {
	return schemas.CodeOf(err) == schemas.CodeInvalid && strings.Contains(err.Error(), "Unknown parameter(s): excludes")
}

// Diff is agent id's work against the commit it started on, leaving out
// what a fetch into the repository it was opened on would: what the
// person's git ignores there, when that repository is on this machine.
func (f *Direct) Diff(ctx context.Context, id string, stat bool) (schemas.DiffReply, error) {
	if err := validAgent(id); err != nil {
		return schemas.DiffReply{}, err
	}
	req := schemas.DiffRequest{AgentID: id, Stat: stat}
	rec, err := f.Record(ctx, id)
	if err != nil {
		return schemas.DiffReply{}, err
	}
	if rec.Workspace == nil {
		// As a fetch says it: the request is wrong, the agent is there.
		return schemas.DiffReply{}, schemas.Errf(schemas.CodeInvalid, "agent %s was not opened on a repository: it has no work to diff", id)
	}
	if ws := rec.Workspace; ws.Source != "" {
		if fi, err := os.Stat(ws.Source); err == nil && fi.IsDir() {
			// Past the bound, the patterns within it: a diff is a look,
			// the fetch says what it leaves out.
			req.Excludes, _ = workspace.CallerExcludes(ctx, ws.Source, schemas.MaxExcludesBytes)
		}
	}
	// Its node, as the record just read names it (a dead agent's too:
	// its work stays a while).
	var rep schemas.DiffReply
	err = f.request(ctx, rec.Node, schemas.VerbDiff, req, &rep, time.Minute)
	if knowsNoExcludes(err) {
		req.Excludes = "" // a node of an earlier version: its diff shows them
		err = f.request(ctx, rec.Node, schemas.VerbDiff, req, &rep, time.Minute)
	}
	return rep, err
}

// Fetched is what Fetch brought into the caller's repository.
type Fetched = schemas.FetchReply

// Fetch creates or moves branch shoal/<id> in the caller's repository
// into (the one the agent was opened on when empty) to the agent's work:
// its commits and, on top, a commit of its uncommitted work. The caller's
// checkout, index and HEAD are not touched, nor is the branch if it is
// the one checked out; a branch holding commits of the agent's that its
// work no longer does moves only with force.
func (f *Direct) Fetch(ctx context.Context, id, into string, force bool) (Fetched, error) {
	rec, err := f.Record(ctx, id)
	if err != nil {
		return Fetched{}, err
	}
	if rec.Workspace == nil {
		return Fetched{}, schemas.Errf(schemas.CodeInvalid, "agent %s was not opened on a repository: there is no work to fetch as a branch", id)
	}
	if into == "" {
		into = rec.Workspace.Source
		if _, err := os.Stat(into); errors.Is(err, fs.ErrNotExist) {
			return Fetched{}, schemas.Errf(schemas.CodeInvalid, "the repository agent %s was opened on, %s, is not there any more (moved or removed): fetch --into where it is now", id, into)
		}
	}
	excludes, err := workspace.CallerExcludes(ctx, into, schemas.MaxExcludesBytes)
	if err != nil {
		f.say("%v", err)
	}
	if rec.Status == schemas.StatusWorking {
		f.say("agent %s is working on turn %d: its work so far is fetched", id, rec.Turn)
	}
	req := schemas.WorkRequest{AgentID: id, Excludes: excludes}
	got, err := f.fetchWork(ctx, rec, req, into, force)
	if _, lacks := errors.AsType[*workspace.LacksError](err); lacks && sameDir(into, rec.Workspace.Source) {
		// The repository the agent was opened on lacks what it started
		// on (a commit amended and pruned since): the node, which has
		// it, sends the work's whole history. Another repository that
		// lacks it is refused: it may be another project.
		f.say("%s lacks the commit agent %s started on: asking node %s for the whole history of its work", into, id, rec.Node)
		req.Whole = true
		got, err = f.fetchWork(ctx, rec, req, into, force)
	}
	return got, err
}

// fetchWork asks agent rec's node for its work as req says and lands it
// in the repository at into.
func (f *Direct) fetchWork(ctx context.Context, rec schemas.AgentRecord, req schemas.WorkRequest, into string, force bool) (Fetched, error) {
	id := rec.ID
	var rep schemas.WorkReply
	waited := f.waitingFor(fmt.Sprintf("node %s to bundle the work of agent %s", rec.Node, id), true)
	err := f.toOwner(ctx, id, schemas.VerbWork, req, &rep, 10*time.Minute)
	if knowsNoExcludes(err) {
		f.say("node %s is of an earlier version, which cannot leave out what your git ignores: its work comes back with it", rec.Node)
		req.Excludes = ""
		err = f.toOwner(ctx, id, schemas.VerbWork, req, &rep, 10*time.Minute)
	}
	waited()
	if err != nil {
		return Fetched{}, err
	}
	// The node says what it bundled; where it lands is the caller's to
	// say: the agent's own branch, at a commit named by its id.
	if want := schemas.BranchName(id); rep.Branch != want {
		return Fetched{}, schemas.Errf(schemas.CodeInternal, "agent %s's node answered with branch %q; an agent's work lands on %s alone: nothing was fetched", id, rep.Branch, want)
	}
	if !workspace.IsCommitID(rep.Tip) {
		return Fetched{}, schemas.Errf(schemas.CodeInternal, "agent %s's node answered with tip %q, not a commit id: nothing was fetched", id, rep.Tip)
	}
	if err := workBundle(id, rec.Node, rec.Workspace.Repo, rep.Bundle); err != nil {
		return Fetched{}, err
	}
	got := Fetched{Branch: rep.Branch, Tip: rep.Tip, Base: rep.Base, Commits: rep.Commits, Files: rep.Files, Into: into}
	if rep.Bundle == "" {
		// The agent's work is where it started, which the caller has.
		if err := workspace.SetBranch(ctx, into, rep.Branch, rep.Tip, force); err != nil {
			return got, schemas.Errf(schemas.CodeInvalid, "%v", err)
		}
		return got, nil
	}
	obs, err := f.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return got, schemas.Errf(schemas.CodeUnavailable, "the repositories' object store: %v", err)
	}
	tmp, err := os.CreateTemp("", "shoal-work-")
	if err != nil {
		return got, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	obj, err := GetObject(ctx, obs, rep.Bundle)
	if err != nil {
		return got, schemas.Errf(schemas.CodeUnavailable, "read the work of agent %s: %v", id, err)
	}
	defer obj.Close()
	// The node says how much the work is; the caller's disk takes no
	// more than a bundle sent the other way may be.
	if info, err := obj.Info(); err == nil && int64(info.Size) > f.maxBundle {
		return got, schemas.Errf(schemas.CodeInvalid, "the work of agent %s is a bundle of %s, more than %s: nothing was fetched", id, bytesText(int64(info.Size)), bytesText(f.maxBundle))
	}
	n, err := io.Copy(tmp, io.LimitReader(obj, f.maxBundle+1))
	if err != nil {
		return got, schemas.Errf(schemas.CodeUnavailable, "read the work of agent %s: %v", id, err)
	}
	if n > f.maxBundle {
		return got, schemas.Errf(schemas.CodeInvalid, "the work of agent %s is a bundle of more than %s: nothing was fetched", id, bytesText(f.maxBundle))
	}
	if err := tmp.Close(); err != nil {
		return got, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	if err := workspace.Land(ctx, into, tmp.Name(), rep.Tip, rep.Branch, force); err != nil {
		if _, lacks := errors.AsType[*workspace.LacksError](err); lacks && !req.Whole && sameDir(into, rec.Workspace.Source) {
			return got, err // asked for whole (Fetch)
		}
		return got, schemas.Errf(schemas.CodeInvalid, "%v", err)
	}
	return got, nil
}

// sameDir reports whether a and b name the same directory.
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, erra := filepath.EvalSymlinks(a)
	rb, errb := filepath.EvalSymlinks(b)
	return erra == nil && errb == nil && ra == rb
}
