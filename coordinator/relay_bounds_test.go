package coordinator_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
