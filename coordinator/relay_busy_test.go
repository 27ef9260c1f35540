package coordinator_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// While a node's share of the relay's work is full, every operation of
// it is answered busy, so that the node sends it again: a bundle chunk
// was answered with a plain error, which the node took for a refusal,
// and an agent's open on a repository failed under an honest burst.
func TestRelayAnswersABundleChunkBusyAsBusy(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	nc := s.Connect(t, broker.RoleNode, "n1")
	// The node's control subject hears each hello's name check and never
	// answers: each hello holds a place in n1's share for a while.
	if _, err := nc.Subscribe(schemas.ControlSubject("n1", schemas.VerbList), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	for range 8 + 256 {
		if err := nc.PublishRequest(schemas.RelaySubject("n1", schemas.RelayHello), nc.NewRespInbox(), nil); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	ask := func(m *nats.Msg) *nats.Msg {
		t.Helper()
		rep, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rec := nats.NewMsg(schemas.RelaySubject("n1", schemas.RelayRecord, "a1"))
	rec.Header.Set("Nats-Expected-Last-Subject-Sequence", "0")
	rec.Data = []byte(`{}`)
	if r := ask(rec); r.Header.Get(schemas.HeaderRelayBusy) == "" {
		t.Fatalf("a record write while the share is full was not answered busy: %q", r.Data)
	}
	body, _ := json.Marshal(schemas.RelayBundleRequest{Name: "repo/x.bundle"})
	for _, m := range []*nats.Msg{
		{Subject: schemas.RelaySubject("n1", schemas.RelayBundleGet, "a1"), Data: body},
		{Subject: schemas.RelaySubject("n1", schemas.RelayBundlePut, "a1"), Header: nats.Header{schemas.HeaderBundle: {"repo/x.bundle"}, schemas.HeaderBundleOffset: {"0"}}, Data: []byte("chunk")},
	} {
		r := ask(m)
		if r.Header.Get(schemas.HeaderRelayBusy) == "" || r.Header.Get(schemas.HeaderRelayError) == "" {
			t.Errorf("%s while the share is full: headers %v, %s; want an error answered busy", m.Subject, r.Header, r.Data)
		}
	}
}
