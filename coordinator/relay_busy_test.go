package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// While a node's share of the relay's work is full, every operation of
// it is answered busy, so that the node sends it again: a bundle chunk
// was answered with a plain error, which the node took for a refusal,
// and an agent's open on a repository failed under an honest burst.
func TestRelayAnswersABundleChunkBusyAsBusy(t *testing.T) {
	t.Parallel()
	// Each hello waits on the coordinator's MCP endpoint, which this one
	// gives only once the test is done: every hello holds its place in
	// n1's share until then, so the share stays full. (Hellos held by a
	// name check of a second each let one place free now and then, and a
	// record taken into it waited behind the rest: the test failed.)
	release := make(chan struct{})
	s := fabrictest.StartSecuredRelay(t, func(c *coordinator.RelayConfig) {
		c.MCP = func(context.Context) (string, string) {
			<-release
			return "", ""
		}
	})
	t.Cleanup(func() { close(release) })
	nc := s.Dial(t, broker.RoleNode, "n1")
	// Hellos are sent until one is answered busy: the relay takes each
	// kind of operation on a subscription of its own, so a record sent
	// straight after them can be taken before the last of them.
	replies := nc.NewRespInbox()
	answers, err := nc.SubscribeSync(replies)
	if err != nil {
		t.Fatal(err)
	}
	for sent := 0; ; sent++ {
		if sent == 2*(8+256) {
			t.Fatalf("%d hellos sent and none answered busy", sent)
		}
		if err := nc.PublishRequest(schemas.RelaySubject("n1", schemas.RelayHello), replies, nil); err != nil {
			t.Fatal(err)
		}
		if sent < 8+256 {
			continue
		}
		m, err := answers.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d hellos sent and none answered: %v", sent+1, err)
		}
		if m.Header.Get(schemas.HeaderRelayBusy) == "" {
			t.Fatalf("a hello was answered while the share held them all: %s", m.Data)
		}
		break
	}
	ask := func(m *nats.Msg) *nats.Msg {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); ; {
			// The node's door opens as its first hello came to the lobby;
			// answered busy, nothing waited for it.
			rep, err := nc.RequestMsg(m, 10*time.Second)
			if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(end) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			return rep
		}
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
