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
// handshake that never answers) is not dropped in silence: the open says
// so, the record says dead, and the stream says why; the id can be opened
// again.
func TestAnOpenThatNeverStartsIsReported(t *testing.T) {
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
	eventually(t, 10*time.Second, "the record says dead", func() bool {
		rec, err := f.Record(ctx, "stuck")
		return err == nil && rec.Status == schemas.StatusDead && rec.Node == "slow"
	})
	var kinds []string
	var why string
	err = f.Replay(ctx, []string{"stuck"}, client.From{}, false, func(r client.Replayed, _ *client.Gap) error {
		ev, err := r.Event()
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, string(ev.Kind()))
		if e, ok := ev.Payload.(schemas.Error); ok {
			why = e.Message
		}
		return nil
	})
	if err != nil || strings.Join(kinds, " ") != "error status" || !strings.Contains(why, "the agent did not start: agent stuck did not start within 300ms") {
		t.Fatalf("the stream: %v %q %v", kinds, why, err)
	}
	if st, err := f.Status(ctx, "stuck"); err != nil || st.Status != schemas.StatusDead {
		t.Fatalf("status: %+v %v", st, err)
	}
	// The id is free again: a second open is claimed and fails the same way.
	if _, err := f.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "stuck"}); schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Fatalf("opening the id again: %v", err)
	}
}
