package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// impostor is node far's process replaced by a hostile one with the
// node's own credentials (the real node is killed): it answers the node's
// control subject as it likes and uses the relay as any node may.
type impostor struct {
	t  *testing.T
	nc *nats.Conn
}

func newImpostor(t *testing.T, p *authPool) *impostor {
	t.Helper()
	p.node.stop(syscall.SIGKILL)
	nc, err := nats.Connect(p.url, nats.UserCredentials(p.creds["far"]), nats.CustomInboxPrefix(schemas.InboxPrefix("node", "far")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &impostor{t: t, nc: nc}
}

// putBundle writes a bundle for agent through the relay, as a node
// writes an agent's work.
func (m *impostor) putBundle(agent, name string, data []byte) {
	m.t.Helper()
	msg := nats.NewMsg(schemas.RelaySubject("far", schemas.RelayBundlePut, agent))
	msg.Header.Set(schemas.HeaderBundle, name)
	msg.Header.Set(schemas.HeaderBundleOffset, "0")
	msg.Header.Set(schemas.HeaderBundleLast, "1")
	msg.Data = data
	rep, err := m.nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		m.t.Fatal(err)
	}
	var none struct{}
	if err := schemas.DecodeReply(rep.Data, &none); err != nil {
		m.t.Fatalf("the relay refused the node's bundle: %v", err)
	}
}

// answer replies to every request of verb with reply.
func (m *impostor) answer(verb schemas.Verb, reply any) {
	m.t.Helper()
	body, _ := json.Marshal(reply)
	sub, err := m.nc.Subscribe(schemas.ControlSubject("far", verb), func(msg *nats.Msg) { msg.Respond(body) })
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { sub.Unsubscribe() })
	m.nc.Flush()
}

// evilBundle is a bundle (no prerequisites, ref refs/shoal/tip) of a
// history of its own, and its tip.
func evilBundle(t *testing.T) ([]byte, string) {
	t.Helper()
	evil := oneCommitRepo(t, "evil", "the node's\n")
	tip := gitIn(t, evil, "rev-parse", "HEAD")
	gitIn(t, evil, "update-ref", "refs/shoal/tip", tip)
	path := filepath.Join(t.TempDir(), "evil.bundle")
	gitIn(t, evil, "bundle", "create", "--quiet", path, "refs/shoal/tip")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, tip
}

// A hostile node (its own credentials, under --auth) answers `shoal
// fetch` with its own branch name: the caller's client takes the node's
// word for the branch it force-moves, so the node replaces the caller's
// main (not checked out) with a history of its own. Fetch's contract is
// branch shoal/<id>, nothing else of the caller's repository.
func TestFetchFromAHostileNodeMovesOnlyTheAgentsBranch(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "coordinator", "boss")
	repo := oneCommitRepo(t, "one", "one\n")
	gitIn(t, repo, "switch", "-q", "-c", "feature")
	mainAt := gitIn(t, repo, "rev-parse", "refs/heads/main")
	a := p.must(t, "open", "--repo", repo, "--permission", "bypass")
	var rec schemas.AgentRecord
	json.Unmarshal([]byte(p.must(t, "status", "--json", a)), &rec)
	if rec.Workspace == nil {
		t.Fatalf("agent %s's record has no workspace", a)
	}

	m := newImpostor(t, p)
	data, tip := evilBundle(t)
	name := schemas.WorkBundleName(rec.Workspace.Repo, rec.Node, a, tip, nil)
	m.putBundle(a, name, data)
	m.answer(schemas.VerbWork, schemas.WorkReply{Bundle: name, Tip: tip, Base: rec.Workspace.Base, Branch: "main", Commits: 1, Files: 1})

	code, out, errOut := runShoal(t, t.TempDir(), p.as, "fetch", a)
	t.Logf("shoal fetch %s: exit %d: %s%s", a, code, out, errOut)
	if got := gitIn(t, repo, "rev-parse", "refs/heads/main"); got != mainAt {
		t.Fatalf("a node's fetch reply moved the caller's main from %s to %s (the node's own history: %s)", mainAt, got, gitIn(t, repo, "log", "--format=%s", "-1", "main"))
	}
}

// A hostile node rewrites its agent's record so that its workspace's
// source names another repository of the caller's machine; the relay
// holds the repository and the bundle, not the source. `shoal fetch <id>`
// with no --into lands the work in whatever the record names: the node
// chooses which of the caller's repositories gets written.
func TestFetchLandsInTheRepositoryTheAgentWasOpenedOn(t *testing.T) {
	t.Parallel()
	p := startAuthPool(t, "coordinator", "boss")
	repo := oneCommitRepo(t, "one", "one\n")
	other := oneCommitRepo(t, "other", "another project\n")
	a := p.must(t, "open", "--repo", repo, "--permission", "bypass")

	m := newImpostor(t, p)
	ent, err := m.nc.Request(schemas.RelaySubject("far", schemas.RelayGet, a), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got schemas.RelayEntry
	if err := json.Unmarshal(ent.Data, &got); err != nil || !got.Found {
		t.Fatalf("the node's read of its agent's record: %s %v", ent.Data, err)
	}
	var rec schemas.AgentRecord
	json.Unmarshal(got.Value, &rec)
	rec.Workspace.Source = other
	body, _ := json.Marshal(rec)
	w := nats.NewMsg(schemas.RelaySubject("far", schemas.RelayRecord, a))
	w.Header.Set("Nats-Expected-Last-Subject-Sequence", strings.TrimSpace(jsonNumber(got.Revision)))
	w.Data = body
	ack, err := m.nc.RequestMsg(w, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the relay's answer to the rewritten record: %s", ack.Data)

	data, tip := evilBundle(t)
	name := schemas.WorkBundleName(rec.Workspace.Repo, rec.Node, a, tip, nil)
	m.putBundle(a, name, data)
	m.answer(schemas.VerbWork, schemas.WorkReply{Bundle: name, Tip: tip, Base: rec.Workspace.Base, Branch: rec.Workspace.Branch, Commits: 1, Files: 1})

	code, out, errOut := runShoal(t, t.TempDir(), p.as, "fetch", a)
	t.Logf("shoal fetch %s: exit %d: %s%s", a, code, out, errOut)
	if refs := gitIn(t, other, "for-each-ref", "--format=%(refname)"); strings.Contains(refs, "shoal/") {
		t.Fatalf("shoal fetch %s wrote into %s, a repository it was never opened on, because its node said so:\n%s", a, other, refs)
	}
}

func jsonNumber(n uint64) string { b, _ := json.Marshal(n); return string(b) }
