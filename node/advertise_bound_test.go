package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/local"
	"github.com/shoalfabric/shoal/schemas"
)

// A model server that lists more models than a record can hold (here
// 5,000 names, counted as the record encodes them, and one as long as a
// page) is advertised by the first that fit: the node's record stays within schemas.MaxNodeRecordBytes,
// which the relay and the nodes bucket hold every record to, so the node
// is still listed and placed, and its first models are still named.
func TestNodeAdvertisesAModelServersListWithinItsBound(t *testing.T) {
	t.Parallel()
	models := []string{strings.Repeat("m", 4096)}
	for i := range 5000 {
		models = append(models, fmt.Sprintf("library/<model>&%04d:latest", i)) // each <, > and & six bytes encoded
	}
	fake := fakemodel.Start(t, fakemodel.Config{Models: models, Default: func(fakemodel.Request) fakemodel.Reply { return fakemodel.Reply{Text: "ok"} }})
	be, err := local.New(local.Config{Kind: backend.BackendOllama, Host: fake.URL()})
	if err != nil {
		t.Fatal(err)
	}
	f := startNode(t, fixtureOptions{node: func(c *node.Config) { c.Backends = append(c.Backends, be) }})
	ctx := f.ctx(30 * time.Second)
	var rec schemas.NodeRecord
	for {
		nodes, err := f.fabric.Nodes(ctx)
		if err != nil {
			t.Fatalf("the nodes: %v", err)
		}
		if len(nodes) == 1 {
			rec = nodes[0]
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := json.Marshal(rec)
	var listed []string
	for _, info := range rec.Backends {
		if info.Kind == backend.BackendOllama {
			listed = info.Models
		}
	}
	encoded, _ := json.Marshal(listed)
	if len(b) > schemas.MaxNodeRecordBytes || len(encoded) > schemas.MaxModelBytes || len(listed) < 100 || len(listed) == len(models) || listed[0] != models[1] {
		t.Errorf("the node's record is %d bytes (at most %d), advertising %d of the server's %d models, first %.40q", len(b), schemas.MaxNodeRecordBytes, len(listed), len(models), listed)
	}
	// Placement still finds the node by one of those it names.
	id := f.open(schemas.OpenRequest{Model: "ollama:" + models[1]})
	if _, err := f.fabric.Close(context.WithoutCancel(ctx), schemas.AgentRequest{AgentID: id}); err != nil {
		t.Error(err)
	}
}
