package broker_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/netproxy"
	"github.com/shoalfabric/shoal/schemas"
)

// An event a dead node sent into a link that went silent (a dropped
// Wi-Fi, a NAT, a VM migrated: TCP keeps the bytes and delivers them when
// the path comes back) reached the server after the stream's duplicate
// window had passed, the event stored meanwhile by the node's next life,
// and was stored a second time: the server kept the silent connection for
// minutes (its default pings, two minutes apart). A connection that does
// not answer the server's pings is closed within half the duplicate
// window, so what it sent late is never read (an outside review: 6 of 10
// runs stored the dead node's events twice, a whole publish window at a
// time).
func TestLateBytesOfASilentLinkAreNotStoredTwice(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	p := netproxy.Start(t, b.ClientURL())
	dead, err := nats.Connect(p.URL(), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	event := func() *nats.Msg {
		m := nats.NewMsg("agent.late")
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("late", 1))
		m.Data = []byte(`{"kind":"status","turn":0,"data":{"status":"idle"}}`)
		return m
	}
	p.Freeze()
	if err := dead.PublishMsg(event()); err != nil { // into the silent link
		t.Fatal(err)
	}
	// The node's next life stores the same event.
	_, js := natstest.JetStream(t, b)
	ctx := natstest.Context(t, 2*time.Minute)
	if _, err := js.PublishMsg(ctx, event()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(broker.DefaultDuplicates + 2*time.Second)
	p.Thaw() // the late bytes arrive
	time.Sleep(2 * time.Second)
	s, err := js.Stream(ctx, schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("agent.late"))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects["agent.late"]; n != 1 {
		t.Errorf("the event is stored %d times: a silent connection's late bytes were read %s after they were sent, past the duplicate window of %s",
			n, broker.DefaultDuplicates+2*time.Second, broker.DefaultDuplicates)
	}
}
