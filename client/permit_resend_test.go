package client_test

// A person's answer to a permission request carries no request id: the
// node's permit book takes the first answer and refuses any later one as
// a conflict. Sent again once the connection came back (its reply lost
// with a coordinator that died after forwarding it), the caller's own
// answer came back as "already answered … by a client of the fabric
// service" (a reader of the change that sends requests again found it).
// It is sent once; a lost reply is the caller's to ask about.

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

func TestAPermitAnswerIsNotSentAgainAcrossAnOutage(t *testing.T) {
	b := natstest.Start(t)
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	svc := natstest.Connect(t, b, opts...)
	var deliveries atomic.Int32
	first := make(chan struct{})
	if _, err := svc.Subscribe(schemas.FabricSubject(schemas.VerbPermit), func(m *nats.Msg) {
		switch deliveries.Add(1) {
		case 1:
			close(first) // taken and acted on; the reply is lost with the outage
		default:
			body, _ := json.Marshal(schemas.ErrorReply{Error: schemas.Errf(schemas.CodeConflict,
				"permission request p1 of agent a1 was already answered: allow by a client of the fabric service")})
			m.Respond(body)
		}
	}); err != nil {
		t.Fatal(err)
	}
	svc.Flush()
	nc := natstest.Connect(t, b, opts...)
	r := client.NewRemote(nc, client.Config{Timeout: 3 * time.Second})
	errc := make(chan error, 1)
	go func() {
		_, err := r.Permit(t.Context(), schemas.PermitRequest{AgentID: "a1", RequestID: "p1", Decision: schemas.Decision("allow")})
		errc <- err
	}()
	<-first
	natstest.Restart(t, b)
	err := <-errc
	if n := deliveries.Load(); n != 1 || schemas.CodeOf(err) != schemas.CodeTimeout {
		t.Errorf("one permit answer across an outage: delivered %d times, the caller got %v; want it delivered once, and the lost reply a timeout", n, err)
	}
}
