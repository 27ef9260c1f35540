package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A second confined node started with the credentials of one running is
// refused as a name taken, and told what to do: another name takes
// credentials of their own (--node-name is refused with --creds, whose
// name it must match), not --node-name alone, as a direct node is told.
func TestConfinedTwinIsToldToTakeCredentialsOfItsOwn(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	h, err := node.New(node.Config{Name: "a", Conn: s.Connect(t, broker.RoleNode, "a"), Dir: t.TempDir(),
		Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}, Confined: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := natstest.Context(t, 30*time.Second)
	err = h.Run(ctx)
	if schemas.CodeOf(err) != schemas.CodeConflict || !strings.Contains(err.Error(), "a node named a is already running") || !strings.Contains(err.Error(), "shoal creds node NAME") {
		t.Fatalf("a second node a with node a's credentials: %v", err)
	}
}
