package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// bundleWriter is node nb, with its real credentials, writing bundles of
// its agent "mine" (opened on repository "r1") through the relay.
type bundleWriter struct {
	t  *testing.T
	nc *nats.Conn
}

func newBundleWriter(t *testing.T, s *fabrictest.Secured, ctx context.Context) *bundleWriter {
	t.Helper()
	putAgent(t, s, ctx, "mine", "")
	return &bundleWriter{t: t, nc: s.Connect(t, broker.RoleNode, "nb")}
}

// putAgent records agent id, node nb's, opened on repository "r1" at
// commit aaaa… from bundle (none when "").
func putAgent(t *testing.T, s *fabrictest.Secured, ctx context.Context, id, bundle string) {
	t.Helper()
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	base := strings.Repeat("a", 40)
	rec := schemas.AgentRecord{ID: id, Node: "nb", Status: schemas.StatusIdle, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now,
		Workspace: &schemas.Workspace{Repo: "r1", Base: base, Commit: base, Bundle: bundle}}
	b, _ := json.Marshal(rec)
	if _, err := kv.Create(ctx, id, b); err != nil {
		t.Fatal(err)
	}
}

// put writes a chunk of bundle name at offset, as a node does, and
// returns the relay's refusal.
func (w *bundleWriter) put(name string, offset int64, data []byte, last bool) error {
	w.t.Helper()
	m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayBundlePut, "mine"))
	m.Header.Set(schemas.HeaderBundle, name)
	m.Header.Set(schemas.HeaderBundleOffset, strconv.FormatInt(offset, 10))
	if last {
		m.Header.Set(schemas.HeaderBundleLast, "1")
	}
	m.Data = data
	rep, err := w.nc.RequestMsg(m, time.Minute) // as long as a node waits
	if err != nil {
		w.t.Fatal(err)
	}
	var none struct{}
	return schemas.DecodeReply(rep.Data, &none)
}

// A confined node writes its agents' work through the relay; the relay
// held which bundles it may write, not how large or how many at once: a
// node with real credentials could fill the coordinator's disk. A bundle
// past the limit is refused and nothing of it stays stored; a write
// within it is stored whole.
func TestRelayHoldsANodesBundleToTheLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)

	chunk := bytes.Repeat([]byte("x"), 256<<10)
	var off int64
	var refused error
	for i := 0; i < 6 && refused == nil; i++ {
		refused = w.put("r1/work/nb/mine/big.bundle", off, chunk, i == 5)
		off += int64(len(chunk))
	}
	if refused == nil {
		t.Fatalf("the relay stored a bundle of %d bytes past its limit of %d", off, limit)
	}
	if !strings.Contains(refused.Error(), fmt.Sprint(limit)) || !strings.Contains(refused.Error(), "r1/work/nb/mine/big.bundle") {
		t.Errorf("the refusal names neither the bundle nor the limit: %v", refused)
	}
	t.Logf("refused: %v", refused)
	obs, err := s.F.JetStream().ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetInfo(ctx, "r1/work/nb/mine/big.bundle"); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("the refused bundle's object: %v, want none", err)
	}
	st, err := s.F.JetStream().Stream(ctx, "OBJ_"+schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Bytes != 0 {
		t.Errorf("the repositories' store holds %d bytes after the refusal (%v), want none of it", info.State.Bytes, err)
	}

	if err := w.put("r1/work/nb/mine/small.bundle", 0, chunk, true); err != nil {
		t.Fatalf("a bundle within the limit: %v", err)
	}
	if info, err := obs.GetInfo(ctx, "r1/work/nb/mine/small.bundle"); err != nil || info.Size != uint64(len(chunk)) {
		t.Errorf("the bundle within the limit: %+v %v", info, err)
	}
}

// Every write in progress holds a write into the object store on the
// coordinator's side: a node may have a few at once, not thousands.
func TestRelayHoldsANodesBundleWritesInProgress(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)

	var refused error
	n := 0
	for ; n < 100 && refused == nil; n++ {
		refused = w.put(fmt.Sprintf("r1/work/nb/mine/open-%d.bundle", n), 0, []byte("part"), false)
	}
	if refused == nil {
		t.Fatalf("the relay took %d bundle writes in progress from one node", n)
	}
	t.Logf("write %d refused: %v", n, refused)
	if n > 17 || !strings.Contains(refused.Error(), "in progress") {
		t.Errorf("write %d refused: %v; want a refusal saying how many are in progress, within the first 16", n, refused)
	}
	if err := w.put("r1/work/nb/mine/open-0.bundle", 4, []byte("-end"), true); err != nil {
		t.Fatalf("ending a write in progress: %v", err)
	}
	if err := w.put("r1/work/nb/mine/after.bundle", 0, []byte("whole"), true); err != nil {
		t.Errorf("a write after one of them ended: %v", err)
	}
}

// A node reads and writes bundles only of its own agents: another node,
// with its own real credentials, is refused both ways.
func TestRelayKeepsANodeFromAnotherNodesBundles(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newBundleWriter(t, s, ctx) // agent "mine", nb's
	other := s.Connect(t, broker.RoleNode, "nc")
	m := nats.NewMsg(schemas.RelaySubject("nc", schemas.RelayBundlePut, "mine"))
	m.Header.Set(schemas.HeaderBundle, "r1/taken.bundle")
	m.Header.Set(schemas.HeaderBundleOffset, "0")
	m.Header.Set(schemas.HeaderBundleLast, "1")
	m.Data = []byte("not nc's")
	rep, err := other.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var none struct{}
	if err := schemas.DecodeReply(rep.Data, &none); err == nil || !strings.Contains(err.Error(), "node nc may not read or write bundles for agent mine") {
		t.Errorf("another node's write of agent mine's bundle: %v", err)
	}
	body, _ := json.Marshal(schemas.RelayBundleRequest{Name: "r1/taken.bundle", Offset: 0})
	rep, err = other.Request(schemas.RelaySubject("nc", schemas.RelayBundleGet, "mine"), body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := schemas.DecodeReply(rep.Data, &none); err == nil || !strings.Contains(err.Error(), "node nc may not read or write bundles for agent mine") {
		t.Errorf("another node's read of agent mine's bundle: %v", err)
	}
}

// A node writes its agents' work under their own names only: a name a
// caller's open reads (schemas.BundleName, which the caller's client
// skips sending when it is there), written first with anything, made
// that open fail for a day; and another node's or agent's work names are
// not its own either. And a node's bundles stored are held to twice the
// largest one in all, so one node does not take the whole store from
// every other node's work and every caller's open.
func TestRelayKeepsANodeToItsOwnWorkBundles(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)
	base := strings.Repeat("a", 40)
	for _, name := range []string{
		schemas.BundleName("r1", base, nil),                   // what an open on r1 at base reads
		schemas.WorkBundleName("r1", "nc", "mine", base, nil), // under another node
		schemas.WorkBundleName("r1", "nb", "theirs", base, nil),
		schemas.WorkBundleName("r2", "nb", "mine", base, nil), // another repository
		"r1/work/nb/mine/../../../" + base + "-0000000000000000.bundle",
	} {
		if err := w.put(name, 0, []byte("junk"), true); err == nil || !strings.Contains(err.Error(), "may write only bundles of agent mine's work") {
			t.Errorf("node nb's write of %s: %v; want a refusal", name, err)
		}
	}
	obs, err := s.F.JetStream().ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetInfo(ctx, schemas.BundleName("r1", base, nil)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("the open's bundle name holds an object after the node's refused write: %v", err)
	}

	chunk := bytes.Repeat([]byte("x"), limit)
	for i := range 2 {
		if err := w.put(schemas.WorkBundleName("r1", "nb", "mine", base, []string{strconv.Itoa(i)}), 0, chunk, true); err != nil {
			t.Fatalf("work bundle %d within the node's room: %v", i, err)
		}
	}
	err = w.put(schemas.WorkBundleName("r1", "nb", "mine", base, []string{"2"}), 0, chunk, true)
	if err == nil || !strings.Contains(err.Error(), "node nb's bundles stored and being written") {
		t.Errorf("a third bundle past the node's room: %v; want a refusal saying the node's bundles are full", err)
	}
	// Writing one of its own again (a fetch asked twice) is no growth.
	if err := w.put(schemas.WorkBundleName("r1", "nb", "mine", base, []string{"0"}), 0, chunk, true); err != nil {
		t.Errorf("writing a bundle it has again: %v", err)
	}
}

// Writes in progress count toward a node's room as they grow: three
// begun at once, none stored yet, may not hold more than the room
// between them (each was let begin with nothing stored).
func TestRelayCountsANodesWritesInProgress(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20 // the room: 2 MiB
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) { c.MaxBundle = limit })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newBundleWriter(t, s, ctx)
	base := strings.Repeat("a", 40)
	chunk := bytes.Repeat([]byte("x"), 256<<10)
	var refused error
	for i := 0; i < 3 && refused == nil; i++ {
		for n := range 3 {
			name := schemas.WorkBundleName("r1", "nb", "mine", base, []string{strconv.Itoa(n)})
			if refused = w.put(name, int64(i*len(chunk)), chunk, false); refused != nil {
				break
			}
		}
	}
	if refused == nil || !strings.Contains(refused.Error(), "bundles stored and being written") {
		t.Fatalf("three writes in progress of 768 KiB each, past a room of 2 MiB: %v; want a refusal", refused)
	}
}

// A read of a bundle that begins past its start makes the relay read the
// object from the start to there (the object store cannot seek): a node
// asking for the last chunk of its agent's bundle over and over made the
// coordinator read it whole each time. One such read is taken (a relay
// that took over a read in progress), the next within the idle time
// refused; reads from the start go on.
func TestRelayHoldsANodesReadsPastTheStart(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := s.F.JetStream()
	obs, err := js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		t.Fatal(err)
	}
	base := strings.Repeat("a", 40)
	name := schemas.BundleName("r1", base, nil)
	if _, err := obs.PutBytes(ctx, name, bytes.Repeat([]byte("b"), 3*schemas.BundleChunk)); err != nil {
		t.Fatal(err)
	}
	putAgent(t, s, ctx, "mine", name)
	putAgent(t, s, ctx, "mine2", name)
	nc := s.Connect(t, broker.RoleNode, "nb")
	read := func(agent string, offset int64) error {
		t.Helper()
		body, _ := json.Marshal(schemas.RelayBundleRequest{Name: name, Offset: offset})
		m, err := nc.Request(schemas.RelaySubject("nb", schemas.RelayBundleGet, agent), body, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(schemas.HeaderRelayError) == "" {
			return nil
		}
		var none struct{}
		return schemas.DecodeReply(m.Data, &none)
	}
	end := int64(2 * schemas.BundleChunk)
	if err := read("mine", end); err != nil {
		t.Fatalf("a first read past the start: %v", err)
	}
	if err := read("mine", end); err == nil || !strings.Contains(err.Error(), "read it from 0") {
		t.Errorf("a second read past the start at once: %v; want a refusal", err)
	}
	// Another of its agents opened on the same bundle is the same node
	// reading the same object.
	if err := read("mine2", end); err == nil || !strings.Contains(err.Error(), "read it from 0") {
		t.Errorf("a read past the start at once for another agent of the node: %v; want a refusal", err)
	}
	for off := int64(0); off < 3*schemas.BundleChunk; off += schemas.BundleChunk {
		if err := read("mine", off); err != nil {
			t.Fatalf("the read from the start, at %d: %v", off, err)
		}
	}
}
