package node_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// A node keeps MaxDead dead agents for review, across its restarts too:
// each run trimmed only its own, so every restart left up to MaxDead more
// records (and every agent alive at a crash) in every list for good; an
// outside review counted 244 dead rows of one node after 40 restarts.
func TestANodeKeepsItsDeadAgentsBoundedAcrossRestarts(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	dir := t.TempDir()
	var last []schemas.AgentRecord
	var opened []string
	for run := range 4 {
		f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), broker: b, dir: dir, node: func(cfg *node.Config) {
			cfg.MaxDead = 2
			// Each agent's MCP configuration, with its token, is written
			// beside its event log.
			cfg.MCP = backend.MCPEndpoint{URL: "http://127.0.0.1:9/mcp", Token: "node-key"}
		}})
		for range 3 {
			id := f.open(schemas.OpenRequest{})
			opened = append(opened, id)
			if _, err := f.fabric.Close(f.ctx(time.Minute), schemas.AgentRequest{AgentID: id}); err != nil {
				t.Fatalf("run %d: close: %v", run, err)
			}
		}
		recs, err := f.fabric.List(f.ctx(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last = recs
		f.shutdown()
	}
	n := 0
	for _, r := range last {
		if r.Node == "n1" && r.Status == schemas.StatusDead {
			n++
		}
	}
	// This run's two and the two kept of the runs before.
	if n > 4 {
		t.Errorf("after four runs of three agents each, the node's dead records: %d, want at most 4 (MaxDead 2, this run's and the ones before)", n)
	}
	// What the node kept of a forgotten agent that holds a secret is
	// gone; its event log stays, as Kaimon's does.
	kept := map[string]bool{}
	for _, r := range last {
		kept[r.ID] = true
	}
	for _, id := range opened {
		if kept[id] {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, id+"-mcp.json")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("forgotten agent %s's MCP configuration: %v, want it removed", id, err)
		}
		if _, err := os.Stat(filepath.Join(dir, id+".events.jsonl")); err != nil {
			t.Errorf("forgotten agent %s's event log: %v, want it kept", id, err)
		}
	}
	if len(kept) == len(opened) {
		t.Fatal("no agent was forgotten")
	}
}
