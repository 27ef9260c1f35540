package node

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/node/proc"
	"github.com/shoalfabric/shoal/schemas"
	"github.com/shoalfabric/shoal/service"
	"github.com/shoalfabric/shoal/workspace"
)

// Agents on a caller's repository. The node keeps one cache per
// repository (a bare repository per identity, under <dir>/repos) and
// gives each such agent a checkout of its own on branch shoal/<id>, under
// <dir>/work/<id>, which is its working directory; what it was opened on
// is kept beside it (<dir>/work/<id>.json), so its diff and its work can
// be had after the agent ended and after a restart. The repository comes
// as a git bundle in the fabric's object store, holding only what the
// node said it lacked: no path of the caller's machine, no remote URL and
// no credential reaches the node.

// DefaultKeepFor is how long an ended agent's checkout stays on its node
// unless the node says otherwise (--keep-for).
const DefaultKeepFor = 7 * 24 * time.Hour

// repos is the node's side of agents on repositories.
type repos struct {
	dir   string
	spool string // the node's scratch files: bundles coming and going, emptied at each start
	cache *workspace.Cache
	git   string // the git's version; "" when the node has none
	why   string // why not, when it has none
	store store  // where bundles are read and written
	node  string
	// confined, when the node can sandbox, is the shoal binary that
	// confines the gits reading agents' checkouts (workspace.Checkout).
	confined string
	// readers bounds the diffs and works under way at once: each holds
	// a copy of an index and a diff's output, whose sizes the agents
	// choose.
	readers chan struct{}

	mu sync.Mutex
	// reading is, per agent, its one read under way and those waiting
	// for it: an agent's checkout can hold its git up until the
	// request's deadline (a FIFO in its .git), and its second diff
	// waits on its first instead of taking another of the readers.
	reading map[string]*agentRead
	// sweeping are the agents whose checkouts sweep is removing: no read
	// begins on one.
	sweeping map[string]bool
}

type agentRead struct {
	turn  chan struct{} // holds one value while the agent's work is read
	users int           // the read under way and those waiting for it
}

// maxReaders is how many agents' work the node reads at once.
const maxReaders = 4

// hold waits for a turn to read agent id's work, until ctx ends: after
// any other read of the same agent's work, then for one of the readers.
func (r *repos) hold(ctx context.Context, id string) (func(), error) {
	gone := schemas.Errf(schemas.CodeNotFound, "agent %s's checkout is gone from node %s", id, r.node)
	r.mu.Lock()
	if r.sweeping[id] {
		r.mu.Unlock()
		return nil, gone
	}
	a := r.reading[id]
	if a == nil {
		a = &agentRead{turn: make(chan struct{}, 1)}
		r.reading[id] = a
	}
	a.users++
	r.mu.Unlock()
	done := func() {
		r.mu.Lock()
		if a.users--; a.users == 0 {
			delete(r.reading, id)
		}
		r.mu.Unlock()
	}
	select {
	case a.turn <- struct{}{}:
	case <-ctx.Done():
		done()
		return nil, schemas.Errf(schemas.CodeUnavailable, "node %s was reading agent %s's work for another request the whole time: ask again", r.node, id)
	}
	select {
	case r.readers <- struct{}{}:
		release := func() { <-r.readers; <-a.turn; done() }
		if _, err := os.Stat(r.checkout(id)); err != nil {
			release() // swept while this read waited its turn
			return nil, gone
		}
		return release, nil
	case <-ctx.Done():
		<-a.turn
		done()
		return nil, schemas.Errf(schemas.CodeUnavailable, "node %s was reading %d agents' work the whole time: ask again", r.node, maxReaders)
	}
}

func newRepos(ctx context.Context, h *Host) *repos {
	r := &repos{dir: filepath.Join(h.cfg.Dir, "work"), spool: filepath.Join(h.cfg.Dir, "spool"), cache: &workspace.Cache{Dir: filepath.Join(h.cfg.Dir, "repos")}, node: h.cfg.Name,
		readers: make(chan struct{}, maxReaders), reading: make(map[string]*agentRead), sweeping: make(map[string]bool)}
	r.store = h.store
	// What a node killed mid-transfer left (a bundle as large as a
	// repository) goes with the next start; the system's temporary
	// directory, often small, was never emptied of it.
	if err := os.RemoveAll(r.spool); err != nil {
		h.log.Warn("cannot empty the node's scratch directory", "dir", r.spool, "err", err)
	}
	if err := os.MkdirAll(r.spool, 0o700); err != nil {
		h.log.Warn("cannot make the node's scratch directory; scratch files go to the system's", "dir", r.spool, "err", err)
		r.spool = ""
	}
	if h.sandbox.kernel != "" {
		r.confined = h.cfg.Reaper
	}
	if v, err := workspace.Available(ctx); err != nil {
		r.why = err.Error()
	} else {
		r.git = v
	}
	return r
}

// checkout is agent id's checkout.
func (r *repos) checkout(id string) string { return filepath.Join(r.dir, id) }

// identity is the name and email of agent id's commits in its checkout:
// a fetch takes a commit on shoal/<id> for Shoal's only when both emails
// are of @shoal.invalid.
func identity(id string) (name, email string) {
	return "shoal agent " + id, id + "@shoal.invalid"
}

// identityVars are the variables through which git takes whoever commits
// from the environment, before any configuration.
var identityVars = []string{"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"}

// identityEnv gives agent id's processes its identity (identity): those
// of its node's environment (a person's own, set where the node was
// started) would make its commits theirs, which a fetch then takes for
// the person's and will not move past, and an identity the agent's git
// is configured with (git -c user.email=…) gives way to them too.
func identityEnv(id string) []string {
	name, email := identity(id)
	return []string{identityVars[0] + "=" + name, identityVars[1] + "=" + email, identityVars[2] + "=" + name, identityVars[3] + "=" + email}
}

func (r *repos) metaPath(id string) string { return filepath.Join(r.dir, id+".json") }

// able refuses what this node cannot do for agents on repositories.
func (r *repos) able() error {
	switch {
	case r.git == "":
		return schemas.Errf(schemas.CodeUnavailable, "node %s cannot run agents on a repository: %s", r.node, r.why)
	}
	return nil
}

// prepare makes agent id's checkout of ws (from its bundle, or from the
// cache when the node had it all) and returns it, with whether this call
// made it: a reopened id goes on in the checkout it has. ws comes back
// with its branch set.
func (r *repos) prepare(ctx context.Context, id string, ws *schemas.Workspace) (string, bool, error) {
	if err := r.able(); err != nil {
		return "", false, err
	}
	for what, c := range map[string]string{"repo": ws.Repo, "base": ws.Base, "commit": ws.Commit} {
		if err := schemas.ValidCommit("workspace "+what, c); err != nil {
			return "", false, schemas.Errf(schemas.CodeInvalid, "%v", err)
		}
	}
	at := ws.Commit // where the checkout begins
	if ws.Resume != "" {
		if err := schemas.ValidCommit("workspace resume", ws.Resume); err != nil {
			return "", false, schemas.Errf(schemas.CodeInvalid, "%v", err)
		}
		at = ws.Resume
	}
	ws.Branch = schemas.BranchName(id)
	dir := r.checkout(id)
	if ws.Dir != "" && filepath.Clean(ws.Dir) != dir {
		// The agent was claimed to work elsewhere: its policy names that.
		return "", false, schemas.Errf(schemas.CodeInvalid, "the open names checkout %s, but node %s makes agent %s's at %s", ws.Dir, r.node, id, dir)
	}
	ws.Dir = dir
	if ws.Resume != "" {
		// The agent comes from another node, with its work there: a
		// checkout this node kept of an earlier life is older than that.
		r.undo(id)
	}
	if _, err := r.meta(id); errors.Is(err, fs.ErrNotExist) {
		// A checkout without the record of what it was opened on is
		// what a node killed while making it left (the record is
		// written last): no agent ever worked in it.
		if err := os.RemoveAll(dir); err != nil {
			return "", false, schemas.Errf(schemas.CodeInternal, "remove the half-made checkout %s: %v", dir, err)
		}
	}
	if old, err := r.meta(id); err == nil {
		if _, err := os.Stat(dir); err == nil {
			if old.Repo != ws.Repo {
				return "", false, schemas.Errf(schemas.CodeConflict, "agent %s works on another repository (%s) on node %s; give this agent another id", id, short(old.Repo), r.node)
			}
			// A reopened id goes on where it was: its start stays the
			// one it was first opened on. The bundle stays the one this
			// open names, as its claim does.
			bundle := ws.Bundle
			*ws = old
			ws.Bundle, ws.Dir = bundle, dir
			return dir, false, nil
		}
	}
	// What is one agent's (its work carried from another node) or one
	// caller's not yet committed work comes in the agent's own checkout,
	// not the cache every checkout of the repository reads, sandboxed or
	// not: the cache holds committed history only.
	if ws.Bundle != "" && (ws.Resume != "" || ws.Commit != ws.Base) {
		if err := r.receiveInto(ctx, id, ws, at, dir); err != nil {
			return "", false, err
		}
		b, _ := json.Marshal(ws)
		if err := os.WriteFile(r.metaPath(id), b, 0o600); err != nil {
			os.RemoveAll(dir)
			return "", false, schemas.Errf(schemas.CodeInternal, "%v", err)
		}
		return dir, true, nil
	}
	if ws.Bundle != "" {
		if err := r.receive(ctx, id, ws, at); err != nil {
			return "", false, err
		}
	}
	for _, c := range []string{ws.Commit, at} {
		if has, _, err := r.cache.Has(ctx, ws.Repo, c); err != nil {
			return "", false, schemas.Errf(schemas.CodeInternal, "read the cache of repository %s: %v", short(ws.Repo), err)
		} else if !has {
			return "", false, schemas.Errf(schemas.CodeInvalid, "node %s does not have commit %s of repository %s, and no bundle of it was sent", r.node, short(c), short(ws.Repo))
		}
		if err := r.cache.Keep(ctx, ws.Repo, c); err != nil {
			return "", false, schemas.Errf(schemas.CodeInternal, "keep commit %s: %v", short(c), err)
		}
	}
	name, email := identity(id)
	if err := r.cache.Checkout(ctx, ws.Repo, at, dir, ws.Branch, name, email); err != nil {
		return "", false, schemas.Errf(schemas.CodeInternal, "check out agent %s's copy: %v", id, err)
	}
	b, _ := json.Marshal(ws)
	if err := os.WriteFile(r.metaPath(id), b, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", false, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	return dir, true, nil
}

// undo removes a checkout prepare made for an open that then failed, or
// one kept past its time.
func (r *repos) undo(id string) {
	os.RemoveAll(r.checkout(id))
	os.Remove(r.metaPath(id))
	os.Remove(filepath.Join(r.dir, id+".ended"))
}

// meta is what agent id was opened on.
func (r *repos) meta(id string) (schemas.Workspace, error) {
	var ws schemas.Workspace
	b, err := os.ReadFile(r.metaPath(id))
	if err != nil {
		return ws, err
	}
	return ws, json.Unmarshal(b, &ws)
}

// receive reads ws's bundle, of commit tip, for agent id into the cache.
func (r *repos) receive(ctx context.Context, id string, ws *schemas.Workspace, tip string) error {
	return r.withBundle(ctx, id, ws, func(path string) error { return r.cache.Receive(ctx, ws.Repo, path, tip) })
}

// receiveInto makes agent id's checkout dir at commit tip from ws's
// bundle, taken into the checkout's own objects.
func (r *repos) receiveInto(ctx context.Context, id string, ws *schemas.Workspace, tip, dir string) error {
	return r.withBundle(ctx, id, ws, func(path string) error {
		name, email := identity(id)
		return r.cache.CheckoutBundle(ctx, ws.Repo, path, tip, dir, ws.Branch, name, email)
	})
}

// withBundle reads ws's bundle for agent id into a file and gives take its
// path.
func (r *repos) withBundle(ctx context.Context, id string, ws *schemas.Workspace, take func(path string) error) error {
	if !strings.HasPrefix(ws.Bundle, ws.Repo+"/") || !strings.HasSuffix(ws.Bundle, ".bundle") {
		return schemas.Errf(schemas.CodeInvalid, "bundle %q is not one of repository %s", ws.Bundle, short(ws.Repo))
	}
	f, err := os.CreateTemp(r.spool, "shoal-bundle-")
	if err != nil {
		return schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := r.store.getBundle(ctx, id, ws.Bundle, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	if err := take(f.Name()); err != nil {
		return schemas.Errf(schemas.CodeInvalid, "bundle %s: %v", ws.Bundle, err)
	}
	return nil
}

// RepoHas says whether the node's cache holds a commit of a repository
// and, when not, what it holds of it.
func (h *Host) RepoHas(ctx context.Context, req schemas.RepoHasRequest) (schemas.RepoHasReply, error) {
	if err := h.repos.able(); err != nil {
		return schemas.RepoHasReply{}, err
	}
	has, haves, err := h.repos.cache.Has(ctx, req.Repo, req.Commit)
	if err != nil {
		return schemas.RepoHasReply{}, schemas.Errf(schemas.CodeInternal, "read the cache of repository %s: %v", short(req.Repo), err)
	}
	return schemas.RepoHasReply{Has: has, Haves: haves}, nil
}

// Diff is an agent's work against the commit it started on.
func (h *Host) Diff(ctx context.Context, req schemas.DiffRequest) (schemas.DiffReply, error) {
	if len(req.Excludes) > schemas.MaxExcludesBytes {
		return schemas.DiffReply{}, schemas.Errf(schemas.CodeInvalid, "the diff of agent %s: %d bytes of patterns to leave out, more than %d", req.AgentID, len(req.Excludes), schemas.MaxExcludesBytes)
	}
	ws, _, err := h.repos.of(req.AgentID)
	if err != nil {
		return schemas.DiffReply{}, err
	}
	// Against its start: with the caller's uncommitted work, that is the
	// commit of it, which is not the agent's doing.
	// git reads what the agent wrote, which may keep it long (until the
	// request's deadline kills it): the node's other requests go on.
	service.LongWait(ctx)
	release, err := h.repos.hold(ctx, req.AgentID)
	if err != nil {
		return schemas.DiffReply{}, err
	}
	defer release()
	co := h.repos.reader(req.AgentID, ws)
	co.Excludes = req.Excludes
	diff, err := co.Diff(ctx, ws.Commit, req.Stat)
	if errors.Is(err, workspace.ErrTooMuch) {
		return schemas.DiffReply{}, schemas.Errf(schemas.CodeInvalid, "the diff of agent %s is past %d MiB: ask for its stat (--stat), or fetch its work", req.AgentID, workspace.MaxOutput>>20)
	}
	if err != nil {
		return schemas.DiffReply{}, schemas.Errf(schemas.CodeInternal, "the diff of agent %s: %v", req.AgentID, err)
	}
	files, err := co.Changed(ctx, ws.Commit)
	if err != nil {
		return schemas.DiffReply{}, schemas.Errf(schemas.CodeInternal, "the diff of agent %s: %v", req.AgentID, err)
	}
	return schemas.DiffReply{Diff: diff, Base: ws.Commit, Files: files}, nil
}

// Work puts a bundle of an agent's work in the object store: its commits
// and, on top, a commit of what it has not committed, whose message says
// which agent and turn made it.
func (h *Host) Work(ctx context.Context, req schemas.WorkRequest) (schemas.WorkReply, error) {
	if len(req.Excludes) > schemas.MaxExcludesBytes {
		return schemas.WorkReply{}, schemas.Errf(schemas.CodeInvalid, "the work of agent %s: %d bytes of patterns to leave out, more than %d", req.AgentID, len(req.Excludes), schemas.MaxExcludesBytes)
	}
	ws, _, err := h.repos.of(req.AgentID)
	if err != nil {
		return schemas.WorkReply{}, err
	}
	if err := h.repos.able(); err != nil {
		return schemas.WorkReply{}, err
	}
	turn, live := 0, false
	h.mu.Lock()
	if a, ok := h.agents[req.AgentID]; ok {
		a.mu.Lock()
		turn, live = a.rec.Turn, true
		a.mu.Unlock()
	}
	h.mu.Unlock()
	if !live {
		// Not run here now (the node restarted, or the agent ended): its
		// record says how far it got.
		if e, err := h.store.get(ctx, req.AgentID); err == nil {
			if rec, err := decodeRecord(e.value); err == nil {
				turn = rec.Turn
			}
		}
	}
	msg := workspace.SnapshotMessage(req.AgentID, h.cfg.Name, turn)
	service.LongWait(ctx) // as in Diff
	release, err := h.repos.hold(ctx, req.AgentID)
	if err != nil {
		return schemas.WorkReply{}, err
	}
	defer release()
	co := h.repos.reader(req.AgentID, ws)
	co.Excludes = req.Excludes
	name, email := identity(req.AgentID)
	tip, err := co.Snapshot(ctx, msg, name, email)
	if err != nil {
		return schemas.WorkReply{}, schemas.Errf(schemas.CodeInternal, "the work of agent %s: %v", req.AgentID, err)
	}
	files, err := co.Changed(ctx, ws.Commit)
	if err != nil {
		return schemas.WorkReply{}, schemas.Errf(schemas.CodeInternal, "the work of agent %s: %v", req.AgentID, err)
	}
	rep := schemas.WorkReply{Tip: tip, Base: ws.Base, Branch: ws.Branch, Files: files}
	haves := req.Haves
	if len(haves) == 0 && !req.Whole {
		if tip == ws.Base {
			return rep, nil // the caller has it
		}
		haves = []string{ws.Base}
	}
	f, err := os.CreateTemp(h.repos.spool, "shoal-work-")
	if err != nil {
		return rep, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	f.Close()
	defer os.Remove(f.Name())
	if rep.Commits, err = co.BundleWork(ctx, tip, haves, f.Name()); err != nil {
		return rep, schemas.Errf(schemas.CodeInternal, "bundle the work of agent %s: %v", req.AgentID, err)
	}
	if rep.Commits == 0 {
		return rep, nil // the reader holds all of it
	}
	rep.Bundle = schemas.WorkBundleName(ws.Repo, h.cfg.Name, req.AgentID, tip, haves)
	in, err := os.Open(f.Name())
	if err != nil {
		return rep, schemas.Errf(schemas.CodeInternal, "%v", err)
	}
	defer in.Close()
	if err := h.store.putBundle(ctx, req.AgentID, rep.Bundle, "the work of agent "+req.AgentID, in); err != nil {
		return rep, err
	}
	return rep, nil
}

// reader is agent id's checkout, as the node reads it: on a node that
// can sandbox, each git there confined to what an agent may read (the
// system, its checkout, its repository's cache), sandboxed or not, so
// nothing the agent wrote in its .git makes the node read for it what
// its sandbox keeps from it.
func (r *repos) reader(id string, ws schemas.Workspace) workspace.Checkout {
	c := workspace.Checkout{Dir: r.checkout(id), Tmp: r.spool}
	if r.confined == "" {
		return c
	}
	objects := r.cache.Objects(ws.Repo)
	c.Jail = func(argv []string, writable ...string) ([]string, error) {
		conf := proc.Confinement{Exe: r.confined, Readable: append(slices.Clone(proc.SystemReadable), objects),
			Writable: append([]string{c.Dir}, writable...)}
		return conf.Wrap(argv)
	}
	return c
}

// of is the workspace and checkout of agent id.
func (r *repos) of(id string) (schemas.Workspace, string, error) {
	if err := schemas.ValidID(id); err != nil {
		return schemas.Workspace{}, "", schemas.Errf(schemas.CodeInvalid, "agent %v", err)
	}
	ws, err := r.meta(id)
	if err != nil {
		// The node knows only its own directory: a record may say the
		// agent was, by this node under another --dir, or one it has
		// since removed.
		return ws, "", schemas.Errf(schemas.CodeNotFound, "node %s keeps no checkout of agent %s in %s (not opened on a repository here, removed since, or kept under another --dir)", r.node, id, r.checkout(id))
	}
	dir := r.checkout(id)
	if _, err := os.Stat(dir); err != nil {
		return ws, "", schemas.Errf(schemas.CodeNotFound, "agent %s's checkout is gone from node %s", id, r.node)
	}
	if _, err := os.Lstat(filepath.Join(dir, ".git")); err != nil {
		// git would say "not a git repository", naming nothing.
		return ws, "", schemas.Errf(schemas.CodeNotFound, "agent %s's checkout on node %s has no .git any more (removed in the checkout, by the agent or by someone on the node): git cannot read its work; its files are still in %s there", id, r.node, dir)
	}
	return ws, dir, nil
}

// short is a commit id as people read it.
func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// sweep removes the checkouts of agents that ended more than keep ago (a
// negative keep keeps them all), but for one whose work is being read. An agent is seen to have ended at the
// first sweep that finds it not live, which marks its checkout so; a
// reopen before the end of keep takes the mark away.
func (r *repos) sweep(keep time.Duration, live func(id string) bool) {
	metas, _ := filepath.Glob(filepath.Join(r.dir, "*.json"))
	for _, m := range metas {
		id := strings.TrimSuffix(filepath.Base(m), ".json")
		mark := filepath.Join(r.dir, id+".ended")
		if live(id) {
			os.Remove(mark)
			continue
		}
		fi, err := os.Stat(mark)
		switch {
		case os.IsNotExist(err):
			os.WriteFile(mark, nil, 0o600)
		case err == nil && keep >= 0 && time.Since(fi.ModTime()) > keep:
			// Not while its work is read (a diff, a fetch): the next
			// sweep takes it. A read asked for meanwhile finds it gone.
			r.mu.Lock()
			if r.reading[id] != nil {
				r.mu.Unlock()
				continue
			}
			r.sweeping[id] = true
			r.mu.Unlock()
			r.undo(id)
			os.Remove(mark)
			r.mu.Lock()
			delete(r.sweeping, id)
			r.mu.Unlock()
		}
	}
}
