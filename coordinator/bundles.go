package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// A confined node reaches the repositories' object store through the
// relay, a chunk per request: it reads the bundle its agent is opened
// from (the one the agent's record names, which the coordinator's side
// wrote when it claimed the agent), and writes bundles of its agents'
// work, of their repository only. Each read or write in progress is held
// between its chunks; the node asks for them in order, and a read asked
// at another offset (a relay that took over) starts again there.

// bundleIdle is how long a read or write in progress waits for its next
// chunk.
const bundleIdle = 2 * time.Minute

// bundleWritesPerNode is how many bundle writes a node may have in
// progress at once: each holds a write into the object store on the
// coordinator's side until its last chunk (or bundleIdle).
const bundleWritesPerNode = 8

// bundleStoreWait bounds the store's reads a bundle chunk is answered
// after (the agent's record, the object store, and at a write's start
// what the node's bundles already hold). The node waits a minute for
// each chunk's answer; the store's client would give up after its own
// five seconds, which a loaded server passes, and the node was refused
// a write it was owed.
const bundleStoreWait = 30 * time.Second

// bundles are the reads and writes in progress, by node, agent and name.
type bundles struct {
	max    int64 // the largest bundle a node may write
	mu     sync.Mutex
	reads  map[string]*bundleRead
	writes map[string]*bundleWrite
	// chunking holds the writes a chunk is being written to (nil while
	// it begins): out of writes meanwhile, they are still the node's,
	// counted among its writes and their bytes, and a second chunk of one
	// at once is refused.
	chunking map[string]*bundleWrite
	seeks    map[string]time.Time // when a read last began past the start, by node and bundle
	ended    bool                 // the relay stopped: no write begins
}

// stop ends every read and write in progress, and returns once the
// writes' stores have given up.
func (b *bundles) stop() {
	b.mu.Lock()
	b.ended = true
	reads, writes := b.reads, b.writes
	b.reads, b.writes = map[string]*bundleRead{}, map[string]*bundleWrite{}
	b.mu.Unlock()
	for _, rd := range reads {
		rd.obj.Close()
	}
	for _, w := range writes {
		w.pw.CloseWithError(errors.New("the relay stopped"))
		<-w.done
	}
}

type bundleRead struct {
	obj       jetstream.ObjectResult
	pos, size int64
	used      time.Time
}

type bundleWrite struct {
	pw   *io.PipeWriter
	done chan error
	pos  int64
	used time.Time
	node string
	// held is what the node had stored when the write began, and what
	// its other writes stored while it went on: with every write in
	// progress it is what the node holds.
	held int64
}

// inProgressLocked is the bytes of node's writes in progress but the one
// of key except; b.mu is held.
func (b *bundles) inProgressLocked(node, except string) int64 {
	var n int64
	for _, w := range b.inProgressOf(node, except) {
		n += w.pos
	}
	return n
}

// inProgressOf lists node's writes in progress, waiting for their next
// chunk or being written to, but the one of key except; b.mu is held.
func (b *bundles) inProgressOf(node, except string) []*bundleWrite {
	var out []*bundleWrite
	for k, w := range b.writes {
		if w.node == node && k != except {
			out = append(out, w)
		}
	}
	for k, w := range b.chunking {
		if _, listed := b.writes[k]; w != nil && !listed && w.node == node && k != except {
			out = append(out, w)
		}
	}
	return out
}

func bundleKey(node, agent, name string) string { return node + "\x00" + agent + "\x00" + name }

// writingLocked counts node's writes in progress, those a chunk is being
// written to among them; b.mu is held.
func (b *bundles) writingLocked(node string) int {
	n := 0
	for k := range b.writes {
		if strings.HasPrefix(k, node+"\x00") {
			n++
		}
	}
	for k := range b.chunking {
		if _, listed := b.writes[k]; !listed && strings.HasPrefix(k, node+"\x00") {
			n++
		}
	}
	return n
}

// sweep ends what has waited too long for its next chunk; b.mu is held.
func (b *bundles) sweepLocked(now time.Time) {
	for k, rd := range b.reads {
		if now.Sub(rd.used) > bundleIdle {
			rd.obj.Close()
			delete(b.reads, k)
		}
	}
	for k, w := range b.writes {
		if now.Sub(w.used) > bundleIdle {
			w.pw.CloseWithError(errors.New("the node stopped writing the bundle"))
			delete(b.writes, k)
		}
	}
	for k, t := range b.seeks {
		if now.Sub(t) > bundleIdle {
			delete(b.seeks, k)
		}
	}
}

// read returns the chunk at offset of bundle name, read by node for
// agent, and whether it is the last.
func (b *bundles) read(ctx context.Context, obs jetstream.ObjectStore, node, agent, name string, offset int64) ([]byte, bool, error) {
	key := bundleKey(node, agent, name)
	b.mu.Lock()
	b.sweepLocked(time.Now())
	rd := b.reads[key]
	delete(b.reads, key)
	b.mu.Unlock()
	if rd != nil && rd.pos != offset {
		rd.obj.Close()
		rd = nil
	}
	if rd == nil && offset > 0 {
		// A read that begins past the start reads the object from it
		// to there (the object store cannot seek): once in a while (a
		// relay that took over, a node that lost a chunk), not a node
		// asking for the last chunk of 2 GiB over and over.
		// Per node and bundle: its agents opened on one commit all read
		// the same object.
		seek := node + "\x00" + name
		b.mu.Lock()
		last, seen := b.seeks[seek]
		if !seen || time.Since(last) > bundleIdle {
			if b.seeks == nil {
				b.seeks = map[string]time.Time{}
			}
			b.seeks[seek] = time.Now()
		}
		b.mu.Unlock()
		if seen && time.Since(last) <= bundleIdle {
			return nil, false, schemas.Errf(schemas.CodeUnavailable, "bundle %s: a read that begins past the start (at %d) is taken once in %v; read it from 0", name, offset, bundleIdle)
		}
	}
	if rd == nil {
		obj, err := obs.Get(ctx, name)
		if err != nil {
			if errors.Is(err, jetstream.ErrObjectNotFound) {
				return nil, false, schemas.Errf(schemas.CodeInvalid, "bundle %s is not in the object store (sent and expired, or never sent whole)", name)
			}
			return nil, false, schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
		}
		info, err := obj.Info()
		if err != nil {
			obj.Close()
			return nil, false, schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
		}
		rd = &bundleRead{obj: obj, size: int64(info.Size)}
		if offset > rd.size {
			obj.Close()
			return nil, false, schemas.Errf(schemas.CodeInvalid, "offset %d is past the end of bundle %s (%d bytes)", offset, name, rd.size)
		}
		if _, err := io.CopyN(io.Discard, obj, offset); err != nil {
			obj.Close()
			return nil, false, schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
		}
		rd.pos = offset
	}
	buf := make([]byte, min(schemas.BundleChunk, rd.size-rd.pos))
	// The object store checks the digest as the last chunk is read.
	if _, err := io.ReadFull(rd.obj, buf); err != nil {
		rd.obj.Close()
		return nil, false, schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
	}
	rd.pos += int64(len(buf))
	if rd.pos >= rd.size {
		// Read to its end, so that the digest is checked.
		if _, err := io.Copy(io.Discard, rd.obj); err != nil {
			rd.obj.Close()
			return nil, false, schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
		}
		rd.obj.Close()
		return buf, true, nil
	}
	rd.used = time.Now()
	b.mu.Lock()
	if b.ended {
		rd.obj.Close()
	} else {
		b.reads[key] = rd
	}
	b.mu.Unlock()
	return buf, false, nil
}

// write adds a chunk at offset to node's bundle name; the last chunk
// returns once the object is stored whole. A bundle past b.max is cut
// off, and nothing of it stays in the object store.
func (b *bundles) write(bg context.Context, obs jetstream.ObjectStore, node, key, name, desc string, offset int64, data []byte, last bool) error {
	b.mu.Lock()
	b.sweepLocked(time.Now())
	if _, under := b.chunking[key]; under {
		// A node sends a bundle's chunks one at a time: two at once
		// would each begin (or go on with) a write of one name.
		b.mu.Unlock()
		return schemas.Errf(schemas.CodeUnavailable, "bundle %s: a chunk of it is being written already; send its chunks one at a time, and the bundle again once that one is answered", name)
	}
	w := b.writes[key]
	delete(b.writes, key)
	busy, ended := b.writingLocked(node), b.ended
	if b.chunking == nil {
		b.chunking = map[string]*bundleWrite{}
	}
	b.chunking[key] = w
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.chunking, key)
		b.mu.Unlock()
	}()
	if offset == 0 {
		if w != nil {
			w.pw.CloseWithError(errors.New("the node began the bundle again"))
		}
		if ended {
			return schemas.Errf(schemas.CodeUnavailable, "bundle %s: the relay is stopping", name)
		}
		if busy >= bundleWritesPerNode {
			return schemas.Errf(schemas.CodeUnavailable, "bundle %s: node %s already has %d bundle writes in progress, the most it may; send it once one of them ends", name, node, busy)
		}
		lctx, cancel := context.WithTimeout(bg, bundleStoreWait)
		held, err := nodeBundleBytes(lctx, obs, node, name)
		cancel()
		if err != nil {
			return schemas.Errf(schemas.CodeUnavailable, "bundle %s: %v", name, err)
		}
		b.mu.Lock()
		writing := b.inProgressLocked(node, key)
		b.mu.Unlock()
		if held+writing+storedCost(0) > b.nodeMax() {
			return schemas.Errf(schemas.CodeUnavailable, "bundle %s: node %s's bundles stored and being written hold %d bytes, the most a node's may (%d; each counts at least %d); they expire with the store's age", name, node, held+writing, b.nodeMax(), minBundleCost)
		}
		pr, pw := io.Pipe()
		w = &bundleWrite{pw: pw, done: make(chan error, 1), node: node, held: held}
		go func() {
			_, err := obs.Put(bg, jetstream.ObjectMeta{Name: name, Description: desc}, pr)
			pr.CloseWithError(err)
			w.done <- err
		}()
		b.mu.Lock()
		b.chunking[key] = w
		b.mu.Unlock()
	}
	if w == nil || w.pos != offset {
		if w != nil {
			w.pw.CloseWithError(errors.New("a chunk out of order"))
		}
		return schemas.Errf(schemas.CodeInvalid, "bundle %s: a chunk at offset %d does not follow what was written; begin again at 0", name, offset)
	}
	if w.pos+int64(len(data)) > b.max {
		w.pw.CloseWithError(errors.New("the bundle passed the limit"))
		<-w.done
		return schemas.Errf(schemas.CodeInvalid, "bundle %s passes %d bytes, the largest a node may write through the relay: nothing of it was stored", name, b.max)
	}
	// The chunk's bytes are counted as the room is checked, so that
	// chunks of the node's other writes written at once see them.
	b.mu.Lock()
	holds := w.held + storedCost(w.pos+int64(len(data))) + b.inProgressLocked(node, key)
	if holds <= b.nodeMax() {
		w.pos += int64(len(data))
	}
	b.mu.Unlock()
	if holds > b.nodeMax() {
		w.pw.CloseWithError(errors.New("the node's bundles passed their room"))
		<-w.done
		return schemas.Errf(schemas.CodeUnavailable, "bundle %s: node %s's bundles stored and being written would hold %d bytes, past the most a node's may (%d): nothing of it was stored", name, node, holds, b.nodeMax())
	}
	if _, err := w.pw.Write(data); err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "store bundle %s: %v", name, err)
	}
	if last {
		w.pw.Close()
		if err := <-w.done; err != nil {
			return client.StoreBundleError(name, err)
		}
		b.mu.Lock()
		delete(b.chunking, key) // stored: no longer in progress
		for _, other := range b.inProgressOf(node, key) {
			other.held += storedCost(w.pos)
		}
		b.mu.Unlock()
		return nil
	}
	w.used = time.Now()
	b.mu.Lock()
	if b.ended {
		b.mu.Unlock()
		w.pw.CloseWithError(errors.New("the relay stopped"))
		<-w.done
		return schemas.Errf(schemas.CodeUnavailable, "bundle %s: the relay is stopping", name)
	}
	b.writes[key] = w
	b.mu.Unlock()
	return nil
}

// nodeMax is how many bytes of bundles a node may have stored in all:
// twice the largest one, so one rogue node cannot take the whole store
// from every open.
func (b *bundles) nodeMax() int64 { return 2 * b.max }

// nodeBundleBytes is the size of node's bundles stored in obs (work
// bundles are named under their node: schemas.WorkBundlePrefix), but
// except.
func nodeBundleBytes(ctx context.Context, obs jetstream.ObjectStore, node, except string) (int64, error) {
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list the repositories' object store: %w", err)
	}
	var n int64
	for _, info := range infos {
		// <repo>/work/<node>/…: the node is the third segment, whatever
		// follows (a repository id holds no slash).
		if seg := strings.SplitN(info.Name, "/", 4); len(seg) == 4 && seg[1] == "work" && seg[2] == node && info.Name != except && !info.Deleted {
			n += storedCost(int64(info.Size))
		}
	}
	return n, nil
}

// Bounds of what a node's bundle takes beyond its bytes.
const (
	// minBundleCost is the least a stored bundle counts toward its
	// node's room, however small: each is an object the store keeps and
	// every write's count lists, so a node's room holds at most so many
	// of them (65,536 in the default 4 GiB).
	minBundleCost = 64 << 10
	// maxBundleDescription is what the relay keeps of the description a
	// node gives its bundle (it is for people listing the store).
	maxBundleDescription = 256
	// maxWorkNameTail is how long a work bundle's name may be past its
	// agent's prefix (schemas.WorkBundleName makes 64 to 88 bytes).
	maxWorkNameTail = 128
)

// storedCost is what a bundle of size bytes counts toward its node's
// room. Its name and description are not counted: the relay holds them
// to a few hundred bytes, well within the least a bundle counts.
func storedCost(size int64) int64 { return max(size, minBundleCost) }

// bundleRight says whether node may read (or, write, write) bundle name
// for agent id: the agent is the node's, opened on a repository; a read
// is of the bundle its record names, a write of a bundle of its
// repository.
func (r *Relay) bundleRight(ctx context.Context, node, id, name string, write bool) error {
	ctx, cancel := context.WithTimeout(ctx, bundleStoreWait)
	defer cancel()
	e, err := r.agents.Get(ctx, id)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.Errf(schemas.CodeForbidden, "node %s may not read or write bundles for agent %s: there is no such agent", node, id)
		}
		return schemas.Errf(schemas.CodeUnavailable, "read agent %s: %v", id, err)
	}
	var rec schemas.AgentRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return schemas.Errf(schemas.CodeInternal, "agent %s's record: %v", id, err)
	}
	p := schemas.NodePrincipal(node)
	// A work bundle is made for a fetch, which may come after the agent
	// ended: the owner alone decides.
	if err := schemas.Decide(p, schemas.AccessStore, schemas.Target{Agent: id, Owner: rec.Node}).Err(p, "read or write bundles for", schemas.Target{Agent: id}); err != nil {
		return err
	}
	ws := rec.Workspace
	switch {
	case ws == nil:
		return schemas.Errf(schemas.CodeForbidden, "agent %s was not opened on a repository: node %s has no bundle of it to read or write", id, node)
	case !write && name != ws.Bundle:
		return schemas.Errf(schemas.CodeForbidden, "node %s may read only the bundle agent %s is opened from, not %s", node, id, name)
	case write && (!strings.HasPrefix(name, schemas.WorkBundlePrefix(ws.Repo, node, id)) || !strings.HasSuffix(name, ".bundle") || strings.Contains(name, "..")):
		return schemas.Errf(schemas.CodeForbidden, "node %s may write only bundles of agent %s's work, named %s…, not %s", node, id, schemas.WorkBundlePrefix(ws.Repo, node, id), name)
	case write && len(name)-len(schemas.WorkBundlePrefix(ws.Repo, node, id)) > maxWorkNameTail:
		return schemas.Errf(schemas.CodeInvalid, "bundle name %.80s… is %d bytes past agent %s's prefix; a work bundle's name is at most %d past it", name, len(name)-len(schemas.WorkBundlePrefix(ws.Repo, node, id)), id, maxWorkNameTail)
	}
	return nil
}

// reposStore is the repositories' object store, looked up within
// bundleStoreWait.
func (r *Relay) reposStore(ctx context.Context) (jetstream.ObjectStore, error) {
	ctx, cancel := context.WithTimeout(ctx, bundleStoreWait)
	defer cancel()
	obs, err := r.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "the repositories' object store: %v", err)
	}
	return obs, nil
}

// bundleGet answers a node's read of a bundle chunk.
func (r *Relay) bundleGet(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	var req schemas.RelayBundleRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Name == "" || req.Offset < 0 {
		r.bundleFail(m, schemas.Errf(schemas.CodeInvalid, "a bundle read names a bundle and an offset (%v)", err))
		return
	}
	if err := r.bundleRight(ctx, node, id, req.Name, false); err != nil {
		r.bundleFail(m, err)
		return
	}
	obs, err := r.reposStore(ctx)
	if err != nil {
		r.bundleFail(m, err)
		return
	}
	chunk, last, err := r.bun.read(ctx, obs, node, id, req.Name, req.Offset)
	if err != nil {
		r.bundleFail(m, err)
		return
	}
	rep := nats.NewMsg(m.Reply)
	rep.Data = chunk
	if last {
		rep.Header.Set(schemas.HeaderBundleLast, "1")
	}
	r.nc.PublishMsg(rep)
}

// bundlePut takes a chunk of a node's bundle of its agent's work.
func (r *Relay) bundlePut(ctx context.Context, m *nats.Msg) {
	node, id, ok := r.from(m)
	if !ok {
		return
	}
	name := m.Header.Get(schemas.HeaderBundle)
	offset, err := strconv.ParseInt(m.Header.Get(schemas.HeaderBundleOffset), 10, 64)
	if name == "" || err != nil || offset < 0 {
		r.bundleFail(m, schemas.Errf(schemas.CodeInvalid, "a bundle chunk names its bundle and offset (%s, %s)", schemas.HeaderBundle, schemas.HeaderBundleOffset))
		return
	}
	if err := r.bundleRight(ctx, node, id, name, true); err != nil {
		r.bundleFail(m, err)
		return
	}
	obs, err := r.reposStore(ctx)
	if err != nil {
		r.bundleFail(m, err)
		return
	}
	desc := m.Header.Get(schemas.HeaderBundleDescription)
	if len(desc) > maxBundleDescription {
		desc = strings.ToValidUTF8(desc[:maxBundleDescription], "")
	}
	if err := r.bun.write(ctx, obs, node, bundleKey(node, id, name), name, desc, offset, m.Data, m.Header.Get(schemas.HeaderBundleLast) == "1"); err != nil {
		r.bundleFail(m, err)
		return
	}
	replyJSON(r.nc, m.Reply, struct{}{})
}

// bundleFail answers a bundle request with why it failed.
func (r *Relay) bundleFail(m *nats.Msg, err error) {
	ce, ok := errors.AsType[*schemas.ControlError](err)
	if !ok {
		ce = &schemas.ControlError{Code: schemas.CodeInternal, Message: fmt.Sprint(err)}
	}
	if ce.Code == schemas.CodeForbidden {
		if node, op, id, ok := schemas.ParseRelaySubject(m.Subject); ok {
			r.metrics.Refused(op)
			r.warn(node+"/"+id+"/bundle", "refused a node's bundle request", "node", node, "agent", id, "why", ce.Message)
		}
	}
	rep := nats.NewMsg(m.Reply)
	rep.Header.Set(schemas.HeaderRelayError, "1")
	rep.Data, _ = json.Marshal(schemas.ErrorReply{Error: ce})
	r.nc.PublishMsg(rep)
}
