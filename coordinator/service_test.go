package coordinator_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// failures counts the fabric service's error replies by verb and code.
type failures struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *failures) RequestFailed(verb string, code schemas.ErrorCode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[verb+"/"+string(code)]++
}

// The fabric service answers a failure as a NATS micro service error:
// the Nats-Service-Error headers beside the JSON body clients decode, a
// count in `nats micro stats shoal-fabric`, and one for the service's
// metrics.
func TestFabricErrorsAreServiceErrors(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := natstest.Connect(t, b)
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	counted := &failures{n: map[string]int{}}
	s, err := coordinator.NewService(coordinator.ServiceConfig{Conn: nc, Client: f, Version: "0.0.0-test", Metrics: counted})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, s)

	caller := natstest.Connect(t, b)
	request := func(verb, body string) *nats.Msg {
		t.Helper()
		m, err := caller.Request("shoal.fabric."+verb, []byte(body), 30*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		return m
	}
	for _, c := range []struct {
		verb, body   string
		code         schemas.ErrorCode
		status, desc string
	}{
		{"status", `{"agent_id":"nope"}`, schemas.CodeNotFound, "404", "no such agent: nope"},
		{"run", `{"agent_id":"nope","text":"hi"}`, schemas.CodeNotFound, "404", "no such agent: nope"},
		{"send", `[`, schemas.CodeInvalid, "400", "invalid request: unexpected end of JSON input"},
		{"open", `{"cwd":"/tmp","node":"Bad Name"}`, schemas.CodeInvalid, "400", `node id "Bad Name" has 'B' at position 1 (want [a-z0-9][a-z0-9_-]{0,63})`},
	} {
		m := request(c.verb, c.body)
		var ce *schemas.ControlError
		if err := schemas.DecodeReply(m.Data, &struct{}{}); !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%s: the body %s is not a %s error: %v", c.verb, m.Data, c.code, err)
		}
		if got := m.Header.Get(micro.ErrorCodeHeader); got != c.status {
			t.Errorf("%s: %s %q, want %q", c.verb, micro.ErrorCodeHeader, got, c.status)
		}
		if got := m.Header.Get(micro.ErrorHeader); got != c.desc {
			t.Errorf("%s: %s %q, want %q", c.verb, micro.ErrorHeader, got, c.desc)
		}
	}
	if m := request("list", `{}`); m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Errorf("a successful list carries %s", micro.ErrorCodeHeader)
	}

	m, err := caller.Request("$SRV.STATS."+schemas.FabricService, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatalf("stats %s: %v", m.Data, err)
	}
	errs := map[string]int{}
	for _, e := range stats.Endpoints {
		errs[e.Name] = e.NumErrors
	}
	// The unknown agent's status is looked for in the stream too, after
	// the service let the request go, so micro does not count it; the
	// others fail before.
	for verb, want := range map[string]int{"run": 1, "send": 1, "open": 1, "list": 0} {
		if errs[verb] != want {
			t.Errorf("nats micro stats counts %d errors of %s, want %d (%s)", errs[verb], verb, want, m.Data)
		}
	}
	counted.mu.Lock()
	defer counted.mu.Unlock()
	for key, want := range map[string]int{"status/not_found": 1, "run/not_found": 1, "send/invalid": 1, "open/invalid": 1} {
		if counted.n[key] != want {
			t.Errorf("the metrics counted %d of %s, want %d (%v)", counted.n[key], key, want, counted.n)
		}
	}
}
