package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// Every list of the nodes holds each node's record whole: a confined
// node beating with a record as large as a message may be (its version
// string) is refused, and what a trusted node writes to the bucket
// itself is bounded the same way, so one node cannot take the list of
// the nodes from everyone.
func TestOneNodesHeartbeatLeavesTheNodesListToEveryone(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "honest")
	ctx := natstest.Context(t, 2*time.Minute)

	evil := s.Connect(t, broker.RoleNode, "evil")
	now := float64(time.Now().Unix())
	rec := schemas.NodeRecord{Name: "evil", Version: "v", Instance: "i1", Labels: map[string]string{},
		Backends: []schemas.BackendInfo{}, MaxAgents: 8, StartedAt: now, Heartbeat: now}
	data, _ := json.Marshal(rec)
	rec.Version += strings.Repeat("v", int(evil.MaxPayload())-len(data)-16)
	data, _ = json.Marshal(rec)
	rep, err := evil.RequestMsgWithContext(ctx, &nats.Msg{Subject: schemas.RelaySubject("evil", schemas.RelayBeat), Data: data})
	if err != nil {
		t.Fatalf("evil's heartbeat: %v", err)
	}
	if !strings.Contains(string(rep.Data), "a node record is at most 65536 bytes") {
		t.Errorf("the relay answered a heartbeat of %d bytes: %.300s", len(data), rep.Data)
	}
	// As large as the bound, it is stored.
	rec.Version = "v"
	data, _ = json.Marshal(rec)
	rec.Version += strings.Repeat("v", schemas.MaxNodeRecordBytes-len(data))
	data, _ = json.Marshal(rec)
	if rep, err := evil.RequestMsgWithContext(ctx, &nats.Msg{Subject: schemas.RelaySubject("evil", schemas.RelayBeat), Data: data}); err != nil || strings.Contains(string(rep.Data), "error") {
		t.Errorf("a heartbeat of %d bytes, the bound: %v %.300s", len(data), err, rep.Data)
	}
	// A node trusted to write the bucket itself is held to it there.
	nodes, err := s.F.JetStream().KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Put(ctx, "big", []byte(`{"name":"big","version":"`+strings.Repeat("v", schemas.MaxNodeRecordBytes+8<<10)+`"}`)); err == nil {
		t.Errorf("the nodes bucket stored a node record of more than %d bytes", schemas.MaxNodeRecordBytes+8<<10)
	}

	observer, err := client.New(s.Connect(t, broker.RoleObserver, "watcher"), client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	listed, err := observer.Nodes(octx)
	if err != nil {
		t.Fatalf("an observer's list of the nodes: %v", err)
	}
	if !slices.ContainsFunc(listed, func(n schemas.NodeRecord) bool { return n.Name == "honest" }) {
		t.Errorf("the observer's list does not show node honest: %d nodes", len(listed))
	}
}

// A confined node's answers are bounded by the requests they settle: the
// relay stores the request it has, answered, cut short (schemas.Answered),
// whatever the node sends as the answered record, so a node asking small
// and answering large (1,000 KiB a time, here into a bucket shrunk to
// 24 MiB so forty such answers would fill it) leaves the room every node
// shares to the others: node nc's one request is stored after them.
func TestOneNodesAnsweredRequestsLeaveTheBucketToOthers(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 3*time.Minute)
	agents, nb, claim := givenMine(t, s, ctx)
	admin := s.F.JetStream()
	kv, err := admin.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := kv.Status(ctx)
	cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	cfg.MaxBytes = 24 << 20
	if _, err := admin.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	theirs := claim
	theirs.ID, theirs.Node = "theirs", "nc"
	b, _ := json.Marshal(theirs)
	if _, err := agents.Create(ctx, "theirs", b); err != nil {
		t.Fatal(err)
	}
	nc, err := jetstream.New(s.Connect(t, broker.RoleNode, "nc"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(js jetstream.JetStream, node, agent, id string, input int, answered bool) error {
		rec := schemas.PermitRecord{AgentID: agent, RequestID: id, Node: node, Tool: "Bash",
			Input:   json.RawMessage(`{"command":"` + strings.Repeat("A", input) + `"}`),
			Options: []schemas.PermissionOption{}, AskedAt: float64(time.Now().UnixNano()) / 1e9, Deadline: float64(time.Now().Add(time.Hour).Unix())}
		if answered {
			rec.Tool = "Other"
			rec.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "deadline", Message: strings.Repeat("M", 8<<10)}
		}
		b, _ := json.Marshal(rec)
		_, err := js.Publish(ctx, schemas.RelaySubject(node, schemas.RelayPermit, agent), b)
		return err
	}
	for i := range 40 {
		id := fmt.Sprintf("r%d", i)
		if err := put(nb, "nb", "mine", id, 10, false); err != nil {
			t.Fatalf("nb's request %d: %v", i, err)
		}
		if err := put(nb, "nb", "mine", id, 1000<<10, true); err != nil {
			t.Fatalf("nb's answer %d: %v", i, err)
		}
	}
	e, err := kv.Get(ctx, schemas.PermitKey("mine", "r0"))
	if err != nil {
		t.Fatal(err)
	}
	var got schemas.PermitRecord
	json.Unmarshal(e.Value(), &got)
	if len(e.Value()) > 8<<10 || got.Tool != "Bash" || got.Answer == nil || got.Answer.By != "deadline" || string(got.Input) != `{"command":"AAAAAAAAAA"}` {
		t.Errorf("nb's answered request is stored as %d bytes: tool %q, input %.60s, answer %+v", len(e.Value()), got.Tool, got.Input, got.Answer)
	}
	if err := put(nc, "nc", "theirs", "honest", 100, false); err != nil {
		t.Errorf("node nc's one permission request of its agent, after node nb's answers: %v", err)
	}
	if _, err := kv.Get(ctx, schemas.PermitKey("theirs", "honest")); err != nil {
		t.Errorf("node nc's request is not stored: %v", err)
	}
}

// An agent keeps its latest answered requests in the bucket, as its node's
// book does: past schemas.MaxAnsweredPermits the relay removes the oldest
// answered ones as new requests come, and never one that waits.
func TestRelayKeepsAnAgentsLatestAnsweredRequests(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 3*time.Minute)
	_, nb, _ := givenMine(t, s, ctx)
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// What the node's asking and answering left, oldest first: three that
	// wait, then more answered than are kept.
	now := float64(time.Now().UnixNano()) / 1e9
	write := func(id string, answered bool) {
		rec := schemas.PermitRecord{AgentID: "mine", RequestID: id, Node: "nb", Tool: "Bash", Input: json.RawMessage(`{}`), Options: []schemas.PermissionOption{}, AskedAt: now}
		if answered {
			rec.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "deadline"}
		}
		b, _ := json.Marshal(rec)
		if _, err := kv.Put(ctx, schemas.PermitKey("mine", id), b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		write(fmt.Sprintf("w%d", i), false)
	}
	const answered = schemas.MaxAnsweredPermits + 40
	for i := range answered {
		write(fmt.Sprintf("a%d", i), true)
	}
	rec, _ := json.Marshal(schemas.PermitRecord{AgentID: "mine", RequestID: "new", Node: "nb", Tool: "Bash", Input: json.RawMessage(`{}`), Options: []schemas.PermissionOption{}, AskedAt: now, Deadline: now + 3600})
	if _, err := nb.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "mine"), rec); err != nil {
		t.Fatalf("a new request past the answered ones kept: %v", err)
	}
	keys, err := kv.ListKeysFiltered(ctx, schemas.PermitKey("mine", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for k := range keys.Keys() {
		kept = append(kept, k)
	}
	want := schemas.MaxPendingPerAgent + schemas.MaxAnsweredPermits
	for _, k := range []string{"w0", "w1", "w2", "new", fmt.Sprintf("a%d", answered-1)} {
		if !slices.Contains(kept, schemas.PermitKey("mine", k)) {
			t.Errorf("request %s is not kept", k)
		}
	}
	if len(kept) > want || slices.Contains(kept, schemas.PermitKey("mine", "a0")) {
		t.Errorf("agent mine keeps %d requests (at most %d), the oldest answered among them: %v", len(kept), want, kept[:min(len(kept), 8)])
	}
}

// A heartbeat written through the relay says so (the monitor waits for
// the relay before it takes such a node for lost), whatever the node
// sent, and keeps everything else the node sent, fields this version
// does not know included.
func TestRelayedHeartbeatSaysItWasRelayed(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, time.Minute)
	nb := s.Connect(t, broker.RoleNode, "nb")
	now := time.Now().Unix()
	data := fmt.Appendf(nil, `{"name":"nb","version":"v","instance":"i1","labels":{},"backends":[],"agents":0,"max_agents":0,"started_at":%d,"heartbeat":%d,"relayed":false,"later":{"x":1}}`+"\n", now, now)
	rep, err := nb.RequestMsgWithContext(ctx, &nats.Msg{Subject: schemas.RelaySubject("nb", schemas.RelayBeat), Data: data})
	if err != nil || strings.Contains(string(rep.Data), "error") {
		t.Fatalf("nb's heartbeat: %v %s", err, rep.Data)
	}
	nodes, err := s.F.JetStream().KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := nodes.Get(ctx, "nb")
	if err != nil {
		t.Fatal(err)
	}
	var rec schemas.NodeRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || !rec.Relayed || rec.Instance != "i1" || !strings.Contains(string(e.Value()), `"later":{"x":1}`) {
		t.Errorf("the record the relay wrote: %s (%v)", e.Value(), err)
	}
}
