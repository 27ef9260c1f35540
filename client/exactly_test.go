package client_test

import (
	"testing"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A retried open is one agent, even when placement would send the retry
// to another node: the request names the same agent both times.
func TestRetriedOpenIsOneAgent(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	for _, name := range []string{"a", "b"} {
		fabrictest.Node(t, srv, node.Config{Name: name, Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
	}
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := schemas.OpenRequest{RequestID: "client-retry-1", CWD: t.TempDir()}
	first, err := f.Open(ctx, req)
	if err != nil || (first.Node != "a" && first.Node != "b") {
		t.Fatalf("first open: %+v %v", first, err)
	}
	schematest.ControlValue(t, "open_reply", first)
	otherNode := map[string]string{"a": "b", "b": "a"}[first.Node]
	// The first node is busier now, so placement would pick the other for
	// a new agent.
	if other, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), Node: first.Node}); err != nil || other.Node != first.Node {
		t.Fatalf("filler: %+v %v", other, err)
	}
	again, err := f.Open(ctx, req)
	if err != nil || again != first {
		t.Fatalf("the retry opened %+v (%v), want %+v", again, err, first)
	}
	recs, err := f.List(ctx)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d agents after a retried open (%v), want 2", len(recs), err)
	}
	schematest.ControlValue(t, "list_reply", schemas.ListReply{Agents: recs})
	// A new request is placed afresh.
	fresh, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir()})
	if err != nil || fresh.Node != otherNode {
		t.Fatalf("a new open went to %+v (%v), want %s", fresh, err, otherNode)
	}
}
