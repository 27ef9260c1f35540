package node_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// A failed control request is answered as a NATS micro service error: the
// Nats-Service-Error headers beside the {"error":{"code","message"}} body
// clients decode, and, for what fails at once, a count in the service's
// stats (`nats micro stats shoal-node`). A failure that comes after a long
// wait (a turn whose agent died) carries the headers too.
func TestControlErrorsAreServiceErrors(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("die")})
	nc := natstest.Connect(t, f.b)
	request := func(verb schemas.Verb, body string) *nats.Msg {
		t.Helper()
		m, err := nc.Request(schemas.ControlSubject("n1", verb), []byte(body), 60*time.Second)
		if err != nil {
			t.Fatalf("%s request: %v", verb, err)
		}
		return m
	}
	failed := func(m *nats.Msg, code schemas.ErrorCode, status, desc string) {
		t.Helper()
		var ce *schemas.ControlError
		if err := schemas.DecodeReply(m.Data, &struct{}{}); !errors.As(err, &ce) || ce.Code != code {
			t.Fatalf("the body %s does not decode to a %s error: %v", m.Data, code, err)
		}
		if got := m.Header.Get(micro.ErrorCodeHeader); got != status {
			t.Errorf("%s header %q, want %q (body %s)", micro.ErrorCodeHeader, got, status, m.Data)
		}
		if got := m.Header.Get(micro.ErrorHeader); got != desc {
			t.Errorf("%s header %q, want %q", micro.ErrorHeader, got, desc)
		}
	}

	failed(request(schemas.VerbStatus, `{"agent_id":"nope"}`), schemas.CodeNotFound, "404", "no such agent: nope")
	failed(request(schemas.VerbStatus, `{"agent_id":"nope"}`), schemas.CodeNotFound, "404", "no such agent: nope")
	failed(request(schemas.VerbSend, `{"agent_id":`), schemas.CodeInvalid, "400", "invalid send request: unexpected EOF")
	failed(request(schemas.VerbRun, `{"agent_id":"nope","text":"hi"}`), schemas.CodeNotFound, "404", "no such agent: nope")

	id := f.open(schemas.OpenRequest{ID: "dies"})
	ok := request(schemas.VerbStatus, `{"agent_id":"`+id+`"}`)
	if h := ok.Header.Get(micro.ErrorCodeHeader); h != "" {
		t.Errorf("a successful reply carries %s %q", micro.ErrorCodeHeader, h)
	}
	// The fake CLI exits in the middle of the turn the run waits for.
	failed(request(schemas.VerbRun, `{"agent_id":"dies","text":"hi"}`), schemas.CodeUnavailable, "503", "agent 'dies' died during the turn")

	m, err := nc.Request("$SRV.STATS."+schemas.ServiceName, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatalf("stats %s: %v", m.Data, err)
	}
	byName := map[string]*micro.EndpointStats{}
	for _, e := range stats.Endpoints {
		byName[e.Name] = e
	}
	for _, want := range []struct {
		endpoint         string
		requests, errors int
		lastError        string
	}{
		{"status", 3, 2, "404:no such agent: nope"},
		{"send", 1, 1, "400:invalid send request: unexpected EOF"},
		{"open", 1, 0, ""},
	} {
		e := byName[want.endpoint]
		if e == nil {
			t.Fatalf("no %s endpoint in the stats: %s", want.endpoint, m.Data)
		}
		if e.NumRequests != want.requests || e.NumErrors != want.errors || e.LastError != want.lastError {
			t.Errorf("%s: %d requests, %d errors, last %q; want %d, %d, %q", want.endpoint, e.NumRequests, e.NumErrors, e.LastError, want.requests, want.errors, want.lastError)
		}
	}
	if e := byName["run"]; e == nil || e.NumRequests != 2 || e.NumErrors < 1 || e.LastError != "404:no such agent: nope" {
		t.Errorf("run: %+v; want 2 requests, the unknown agent's counted", e)
	}
}
