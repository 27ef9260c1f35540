package node_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/node"
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
	failed(request(schemas.VerbSend, `{"agent_id":`), schemas.CodeInvalid, "400", "invalid send request: the request is not JSON: unexpected EOF")
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
		{"send", 1, 1, "400:invalid send request: the request is not JSON: unexpected EOF"},
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

// counts records what a node reports to its Metrics.
type counts struct {
	mu            sync.Mutex
	started       int
	ended, failed map[string]int
	stored        int
	negative      bool
}

func (c *counts) TurnStarted() { c.mu.Lock(); c.started++; c.mu.Unlock() }
func (c *counts) TurnEnded(stop schemas.StopReason) {
	c.mu.Lock()
	c.ended[string(stop)]++
	c.mu.Unlock()
}
func (c *counts) EventStored(latency time.Duration) {
	c.mu.Lock()
	c.stored++
	c.negative = c.negative || latency < 0
	c.mu.Unlock()
}
func (c *counts) RequestFailed(verb schemas.Verb, code schemas.ErrorCode) {
	c.mu.Lock()
	c.failed[string(verb)+"/"+string(code)]++
	c.mu.Unlock()
}

// A node reports its turns, stored events and failed requests to its
// Metrics, and tells its agents by status and its outbox depth.
func TestNodeMetrics(t *testing.T) {
	t.Parallel()
	c := &counts{ended: map[string]int{}, failed: map[string]int{}}
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo"), node: func(cfg *node.Config) { cfg.Metrics = c }})
	if by := f.host.AgentsByStatus(); by[schemas.StatusIdle] != 0 || len(by) != 4 {
		t.Errorf("no agents yet: %v", by)
	}
	id := f.open(schemas.OpenRequest{})
	rep, err := f.fabric.Run(f.ctx(60*time.Second), schemas.RunRequest{AgentID: id, Text: "hello"})
	if err != nil || rep.StopReason != schemas.StopEndTurn {
		t.Fatalf("run: %+v %v", rep, err)
	}
	nc := natstest.Connect(t, f.b)
	if _, err := nc.Request(schemas.ControlSubject("n1", schemas.VerbStatus), []byte(`{"agent_id":"nope"}`), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	page, err := f.fabric.Events(f.ctx(10*time.Second), schemas.EventsRequest{AgentID: id, IncludeDeltas: true, Max: 5000})
	if err != nil || page.More {
		t.Fatalf("events: %+v %v", page, err)
	}
	poll.Until(t, 10*time.Second, "every stored event is counted", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.stored == len(page.Events) && f.host.OutboxDepth() == 0
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started != 1 || c.ended["end_turn"] != 1 || len(c.ended) != 1 || c.negative {
		t.Errorf("turns started %d, ended %v, a negative latency %v", c.started, c.ended, c.negative)
	}
	if c.failed["status/not_found"] != 1 || len(c.failed) != 1 {
		t.Errorf("failed requests: %v", c.failed)
	}
	if by := f.host.AgentsByStatus(); by[schemas.StatusIdle] != 1 || by[schemas.StatusWorking] != 0 {
		t.Errorf("agents by status: %v", by)
	}
}
