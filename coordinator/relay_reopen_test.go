package coordinator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A close answered means the agent's record says it is dead: an open of
// the same id right after it is a new life, never "already in use" (the
// node answered once the closing events were stored, and its record,
// written apart, could still say idle to a reopen under load).
func TestCloseAnsweredLeavesTheRecordDead(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 2*time.Minute)
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "again"}); err != nil {
			t.Fatalf("life %d: open: %v", i+1, err)
		}
		if _, err := s.F.Close(ctx, schemas.AgentRequest{AgentID: "again"}); err != nil {
			t.Fatalf("life %d: close: %v", i+1, err)
		}
		e, err := kv.Get(ctx, "again")
		if err != nil {
			t.Fatal(err)
		}
		var rec schemas.AgentRecord
		json.Unmarshal(e.Value(), &rec)
		if rec.Status != schemas.StatusDead {
			t.Fatalf("life %d: the close was answered while the record says %s", i+1, rec.Status)
		}
	}
}
