package coordinator_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A relay answer that fits a message is answered, to its last byte; only
// one the publish refuses is turned into "more than a message holds".
func TestRelayAnswersWhatFitsAMessage(t *testing.T) {
	t.Parallel()
	const max = 64 << 10
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.MaxPayload = max })
	ctx := natstest.Context(t, time.Minute)
	agents, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	rec := schemas.AgentRecord{ID: "big1", Node: "n1", Status: schemas.StatusDead, Model: "sonnet", EventLog: "big1.jsonl"}
	b, _ := json.Marshal(rec)
	// The answer {"found":true,"revision":N,"value":<record>} about 600
	// bytes short of a message: within the last KiB.
	rec.CWD = "/" + strings.Repeat("p", max-600-len(b)-40)
	b, _ = json.Marshal(rec)
	if _, err := agents.Put(ctx, rec.ID, b); err != nil {
		t.Fatal(err)
	}
	nc := s.Connect(t, broker.RoleNode, "n1")
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	m, err := nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: schemas.RelaySubject("n1", schemas.RelayGet, rec.ID)})
	if err != nil {
		t.Fatal(err)
	}
	var e schemas.RelayEntry
	if err := schemas.DecodeReply(m.Data, &e); err != nil || !e.Found {
		t.Fatalf("a record whose answer (%d bytes) fits a message of %d: found %v, %v", len(b)+40, max, e.Found, err)
	}
}
