package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// An agent that does not start within the node's open timeout (an ACP
// handshake that never answers): the open says so, and nothing is left
// of it, no record and nothing on the stream; the id can be opened again.
func TestAnOpenThatNeverStartsLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	fabrictest.Node(t, srv, node.Config{Name: "slow", OpenTimeout: 300 * time.Millisecond,
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{StartHang: true})}})
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 30*time.Second)
	_, err = f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "stuck"})
	if schemas.CodeOf(err) != schemas.CodeTimeout || !strings.Contains(err.Error(), "agent stuck did not start within 300ms") {
		t.Fatalf("the open: %v (%s)", err, schemas.CodeOf(err))
	}
	if rec, err := f.Record(ctx, "stuck"); schemas.CodeOf(err) != schemas.CodeNotFound {
		t.Fatalf("the failed open left a record: %+v %v", rec, err)
	}
	if list, err := f.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("agent_list after the failed open: %+v %v", list, err)
	}
	var kinds []string
	err = f.Replay(ctx, []string{"stuck"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		ev, err := r.Event()
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, string(ev.Kind()))
		return nil
	})
	if len(kinds) != 0 {
		t.Fatalf("the stream holds %v (%v)", kinds, err)
	}
	// The id is free again: a second open is claimed and fails the same way.
	if _, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "stuck"}); schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Fatalf("opening the id again: %v", err)
	}
}
