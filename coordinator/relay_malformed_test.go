package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node's message on a subject of its own namespace that names no
// operation of the relay (an unknown one, an agent id too long or not
// UTF-8, tokens to spare) is answered with an error that names the
// subject; it waited out its request's time unanswered, where a
// malformed body is told what is wrong (outside review).
func TestRelayAnswersAMalformedSubject(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	nc := s.Connect(t, broker.RoleNode, "n1")
	if _, err := nc.Request(schemas.RelaySubject("n1", schemas.RelayHello), nil, 10*time.Second); err != nil {
		t.Fatalf("hello: %v", err)
	}
	for _, subject := range []string{
		"shoal.relay.n1.zzz",
		"shoal.relay.n1.get." + strings.Repeat("a", 300),
		"shoal.relay.n1.get.\xff\xfe",
		"shoal.relay.n1.get.a1.x.y",
		"shoal.relay.n1.hello.a1",
	} {
		m, err := nc.Request(subject, []byte(`{}`), 10*time.Second)
		if err != nil {
			t.Errorf("%q: %v", subject, err)
			continue
		}
		err = schemas.DecodeReply(m.Data, &struct{}{})
		if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "names no operation of the relay") {
			t.Errorf("%q answered %s, want an invalid subject named", subject, m.Data)
		}
	}
}
