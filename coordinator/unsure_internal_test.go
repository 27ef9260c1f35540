package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// failingKV is a bucket every read of which fails, as reads do while
// JetStream elects a leader or the server is loaded past its timeouts.
type failingKV struct{ jetstream.KeyValue }

func (failingKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return nil, errors.New("context deadline exceeded")
}

// An event the relay cannot decide because a read failed is answered 503,
// which the node's publisher sends again; it was refused (403), which the
// publisher takes as final and drops the event: a gap for a passing
// failure. A record that is not there is still a refusal.
func TestRelayAnswersAFailedReadAsToBeSentAgain(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	r, err := NewRelay(RelayConfig{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	r.agents = failingKV{}
	owns, err := r.owns(t.Context(), "n1", "a1")
	if _, isUnsure := errors.AsType[unsure](err); owns || !isUnsure {
		t.Fatalf("owns through a failing read: %v, %v; want an unsure error", owns, err)
	}
	answer := func(err error) (code int, description string) {
		t.Helper()
		inbox := nc.NewRespInbox()
		sub, serr := nc.SubscribeSync(inbox)
		if serr != nil {
			t.Fatal(serr)
		}
		defer sub.Unsubscribe()
		r.refuseOrRetry(&nats.Msg{Subject: schemas.RelaySubject("n1", schemas.RelayEvent, "a1"), Reply: inbox}, "n1", "a1", err)
		m, serr := sub.NextMsg(10 * time.Second)
		if serr != nil {
			t.Fatal(serr)
		}
		var ack struct {
			Error struct {
				Code        int    `json:"code"`
				Description string `json:"description"`
			} `json:"error"`
		}
		json.Unmarshal(m.Data, &ack)
		return ack.Error.Code, ack.Error.Description
	}
	if code, why := answer(err); code != 503 {
		t.Errorf("an event whose owner could not be read: answered %d %q, want 503", code, why)
	}
	if code, _ := answer(notOwner("n1", "a1")); code != schemas.RelayRefused {
		t.Errorf("an event of an agent not the node's: answered %d, want the refusal %d", code, schemas.RelayRefused)
	}
}
