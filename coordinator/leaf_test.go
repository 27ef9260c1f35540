package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/tlstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node behind NAT joins as a leaf node: its embedded leaf server dials
// the hub's leaf port over TLS with the node's credentials, the node
// connects to it in process, appears in placement and runs an agent.
func TestLeafNodeJoinsThePool(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "hub")
	pair := ca.Issue(t, "hub")
	s := fabrictest.StartSecured(t, func(c *broker.Config) {
		c.Leaf.Port = -1
		c.TLS = broker.TLSConfig{Cert: pair.Cert, Key: pair.Key, CA: ca.File}
	})
	leaf, err := broker.NewLeaf(broker.LeafRemote{URL: s.B.LeafURL(), Credentials: s.Creds(t, broker.RoleNode, "mac"), TLS: broker.ClientTLS{CA: ca.File}})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Start(natstest.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leaf.Shutdown)
	nc, err := leaf.Connect(nats.CustomInboxPrefix(schemas.InboxPrefix("node", "mac")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s.RunNode(t, "mac", nc)

	ctx := natstest.Context(t, 60*time.Second)
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil || open.Node != "mac" {
		t.Fatalf("placement: %+v %v", open, err)
	}
	run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: open.AgentID, Text: "from the hub"})
	if err != nil || run.Text != "echo: from the hub" {
		t.Fatalf("run on the leaf node: %+v %v", run, err)
	}
	out, err := s.F.Output(ctx, schemas.OutputRequest{AgentID: open.AgentID})
	if err != nil || out.Text != "echo: from the hub" {
		t.Fatalf("the hub's stream: %+v %v", out, err)
	}
}

// A leaf whose credentials the hub does not accept says so.
func TestLeafWithBadCredentials(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.Leaf.Port = -1 })
	other := fabrictest.StartSecured(t)
	leaf, err := broker.NewLeaf(broker.LeafRemote{URL: s.B.LeafURL(), Credentials: other.Creds(t, broker.RoleNode, "mac")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	err = leaf.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "could not join") || !strings.Contains(strings.ToLower(err.Error()), "authoriz") {
		t.Fatalf("got %v, want an authorization error", err)
	}
}
