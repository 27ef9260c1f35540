package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/broker"
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

func (f *failures) RequestFailed(verb schemas.Verb, code schemas.ErrorCode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[string(verb)+"/"+string(code)]++
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
	rows := []struct {
		verb, body   string
		code         schemas.ErrorCode
		status, desc string
	}{
		{"status", `{"agent_id":"nope"}`, schemas.CodeNotFound, "404", "no such agent: nope"},
		{"run", `{"agent_id":"nope","text":"hi"}`, schemas.CodeNotFound, "404", "no such agent: nope"},
		{"send", `[`, schemas.CodeInvalid, "400", "invalid send request: the request is not JSON: unexpected EOF"},
		{"send", `["a"]`, schemas.CodeInvalid, "400", "invalid send request: the request must be a JSON object, not an array"},
		{"open", `{"cwd":"/tmp","node":"Bad Name"}`, schemas.CodeInvalid, "400", `invalid open request: Invalid parameter(s): node must match ^[a-z0-9][a-z0-9_-]{0,63}$, not "Bad Name"`},
		// Every argument is checked as the schema says: a missing text,
		// an unknown field, what only Shoal sets, an id that is no id.
		{"send", `{"agent_id":"nope"}`, schemas.CodeInvalid, "400", "invalid send request: Missing required parameter(s): text"},
		{"send", `{"agent_id":"nope","text":"hi","colour":"red"}`, schemas.CodeInvalid, "400", "invalid send request: Unknown parameter(s): colour. Valid parameters are: agent_id, request_id, text"},
		{"open", `{"cwd":"/tmp","parent":"boss","depth":1}`, schemas.CodeInvalid, "400", "invalid open request: Unknown parameter(s): depth, parent. Valid parameters are: allowed_tools, ask, ask_timeout, budget_tokens, budget_usd, cwd, disallowed_tools, effort, id, labels, mcp_config, model, node, only, permission, permission_mode, reach, ref, repo, request_id, sandbox, sandbox_kind, sandbox_net, system_prompt, with_changes"},
		{"open", `{"cwd":"/tmp","id":"../x"}`, schemas.CodeInvalid, "400", `invalid open request: Invalid parameter(s): id must match ^[a-z0-9][a-z0-9_-]{0,63}$, not "../x"`},
		{"run", `{"agent_id":"` + strings.Repeat("a", 5000) + `","text":"hi"}`, schemas.CodeInvalid, "400", "invalid run request: Invalid parameter(s): agent_id must match ^[a-z0-9][a-z0-9_-]{0,63}$, not a string of 5000 characters"},
	}
	failed := map[string]int{} // by verb, then by verb/code
	for _, c := range rows {
		failed[c.verb]++
		failed[c.verb+"/"+string(c.code)]++
	}
	for _, c := range rows {
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

	// micro counts a request once its handler returns, which may be just
	// after the reply reached us: the counts are read until they settle.
	// The unknown agent's status is looked for in the stream too, after
	// the service let the request go, so micro does not count it; the
	// others fail before.
	want := map[string]int{"run": failed["run"], "send": failed["send"], "open": failed["open"], "list": 0}
	var last []byte
	counts := func() bool {
		m, err := caller.Request("$SRV.STATS."+schemas.FabricService, nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		last = m.Data
		var stats micro.Stats
		if err := json.Unmarshal(m.Data, &stats); err != nil {
			t.Fatalf("stats %s: %v", m.Data, err)
		}
		for _, e := range stats.Endpoints {
			if w, ok := want[e.Name]; ok && e.NumErrors != w {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for !counts() {
		if time.Now().After(deadline) {
			t.Fatalf("nats micro stats count %s, want errors %v", last, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	counted.mu.Lock()
	defer counted.mu.Unlock()
	for _, key := range []string{"status/not_found", "run/not_found", "run/invalid", "send/invalid", "open/invalid"} {
		want := failed[key]
		if counted.n[key] != want {
			t.Errorf("the metrics counted %d of %s, want %d (%v)", counted.n[key], key, want, counted.n)
		}
	}
}

// A replay asked for with a reply subject so long that the service's own
// flow-control request to it (that subject and the service's inbox on one
// protocol line) would pass the server's limit is not served: the
// service's connection, which every client's requests share, stays open
// past the moment that request would have gone out, and answers others.
func TestReplayWithALongReplySubjectLeavesTheServiceUp(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc := natstest.Connect(t, b)
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := coordinator.NewService(coordinator.ServiceConfig{Conn: nc, Client: f, Version: "0.0.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	fabrictest.Run(t, s)
	caller := natstest.Connect(t, b)
	long := "_INBOX." + strings.Repeat("x", 4050)
	if err := caller.PublishRequest(schemas.FabricSubject(schemas.VerbReplay), long, []byte(`{"agents":["a1"],"follow":true}`)); err != nil {
		t.Fatal(err)
	}
	// The flow-control request goes out after ReplayIdle without events.
	deadline := time.Now().Add(schemas.ReplayIdle + 2*time.Second)
	for time.Now().Before(deadline) {
		if nc.IsClosed() {
			t.Fatalf("the service's connection was closed: %v", nc.LastError())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := caller.Request(schemas.FabricSubject(schemas.VerbList), []byte(`{}`), 10*time.Second); err != nil {
		t.Fatalf("the service after the long replay request: %v", err)
	}
}

// Each replay the fabric service serves holds a reader of the agents'
// stream, and the stream has at most 1,000 for everyone: an observer's
// credentials following a thousand replays took every reader of the
// fabric. One credential's replays under way are bounded, a replay past
// the bound is refused at once naming it, and another's reads go on.
func TestFabricServiceBoundsEachCallersReads(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	storeEvents(t, s, "quiet", 1)
	watcher := client.NewRemote(s.Connect(t, "observer", "dash"), client.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const tries = 80
	ended := make(chan error, tries)
	var following sync.WaitGroup
	defer following.Wait()
	defer cancel()
	for range tries {
		following.Go(func() {
			ended <- watcher.Replay(ctx, []string{"quiet"}, client.From{}, true, func(client.Replayed, *client.Gap) error { return nil })
		})
	}
	for refused := 0; refused < tries-64; refused++ {
		select {
		case err := <-ended:
			if schemas.CodeOf(err) != schemas.CodeUnavailable || !strings.Contains(err.Error(), "64 replays under these credentials are") {
				t.Fatalf("a replay past the bound: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d followed replays refused in a minute; want all but 64", refused, tries)
		}
	}
	// A read of a moment is bounded in all, not per caller; another
	// credential's replay goes on.
	if _, err := watcher.Output(t.Context(), schemas.OutputRequest{AgentID: "quiet"}); err != nil {
		t.Errorf("an output read beside the replays: %v", err)
	}
	other := client.NewRemote(s.Connect(t, "observer", "other"), client.Config{})
	if err := other.Replay(t.Context(), []string{"quiet"}, client.From{}, false, func(client.Replayed, *client.Gap) error { return nil }); err != nil {
		t.Errorf("another credential's replay: %v", err)
	}
	select {
	case err := <-ended:
		t.Errorf("a replay within the bound ended: %v", err)
	default:
	}
}

// A replay through the fabric service asks its reader to answer every
// ReplayAckEvery events; under credentials the answer goes to the one
// reply subject a client or an observer may publish
// (schemas.ReplayAckPrefix), and the replay goes on.
func TestFabricReplayFlowControlUnderCredentials(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	const n = 3*schemas.ReplayAckEvery + 10
	storeEvents(t, s, "long", n)
	for _, role := range []string{"observer", "client"} {
		r := client.NewRemote(s.Connect(t, broker.Role(role), "reader-"+role), client.Config{})
		got := 0
		err := r.Replay(t.Context(), []string{"long"}, client.From{}, false, func(client.Replayed, *client.Gap) error { got++; return nil })
		if err != nil || got != n {
			t.Errorf("the %s's replay: %d of %d events, %v", role, got, n, err)
		}
	}
}

// A requester names any reply subject it likes: an observer naming
// another's inbox, or namespaces nobody has, made the replays count as
// theirs, locking the other out or passing every bound. A replay makes
// no reader of the stream until the reply subject's own subscriber has
// answered its first flow-control request.
func TestFabricReplayCountsOnlyCallersThatAnswer(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	js := storeEvents(t, s, "watched", 1)
	eve := s.Connect(t, "observer", "eve")
	victimReply := schemas.InboxPrefix("observer", "victim")
	req := []byte(`{"agents":["watched"],"follow":true}`)
	for i := range 300 {
		reply := fmt.Sprintf("_INBOX.made-up-%d.x", i)
		if i < 100 {
			reply = fmt.Sprintf("%s.x%d", victimReply, i)
		}
		if err := eve.PublishRequest(schemas.FabricSubject(schemas.VerbReplay), reply, req); err != nil {
			t.Fatal(err)
		}
	}
	eve.Flush()
	stream, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	// The victim's own replays are served, however many the forger named
	// it in.
	victim := client.NewRemote(s.Connect(t, "observer", "victim"), client.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var following sync.WaitGroup
	defer following.Wait()
	defer cancel()
	got := make(chan error, 4)
	for range 4 {
		following.Go(func() {
			for {
				err := victim.Replay(ctx, []string{"watched"}, client.From{}, true, func(client.Replayed, *client.Gap) error {
					got <- nil
					return nil
				})
				// The forged replays naming its inbox count as its own
				// until each has had no answer, a moment (a no-responders
				// status): the victim's may be refused during it, never
				// after. (A CI run's loaded cores once made the moment
				// outlast the victim's first try.)
				if err != nil && strings.Contains(err.Error(), "waiting for their first answer") && ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				got <- err
				return
			}
		})
	}
	for range 4 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("the victim's replay: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the victim's replay gave nothing in 30 s")
		}
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers > 20 {
		t.Errorf("the stream has %d consumers while 300 replays named reply subjects nobody answers; want none of theirs", info.State.Consumers)
	}
}

// storeEvents stores n text events of agent id, numbered from 1, with the
// coordinator's rights, and returns its JetStream.
func storeEvents(t *testing.T, s *fabrictest.Secured, id string, n int) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(s.F.Conn())
	if err != nil {
		t.Fatal(err)
	}
	env, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hello")}})
	for i := 1; i <= n; i++ {
		m := nats.NewMsg(schemas.EventSubject(id))
		m.Data = env
		m.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, uint64(i)))
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatalf("agent %s's %d events were not stored", id, n)
	}
	return js
}

// An observer that hears its inbox and never answers held a replay's
// first question for its whole wait, as many as it sent: 1,100 of them
// took every place the coordinator keeps for replays waiting to be
// answered, and another observer's replay was refused. A caller's
// replays waiting for their first answer are bounded too.
func TestFabricReplayWaitingForAnAnswerIsBoundedPerCaller(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	storeEvents(t, s, "watched", 1)
	eve := s.Connect(t, "observer", "eve")
	if _, err := eve.Subscribe(schemas.InboxPrefix("observer", "eve")+".>", func(*nats.Msg) {}); err != nil { // hears, never answers
		t.Fatal(err)
	}
	req := []byte(`{"agents":["watched"],"follow":true}`)
	for i := range 1100 {
		if err := eve.PublishRequest(schemas.FabricSubject(schemas.VerbReplay), fmt.Sprintf("%s.silent%d", schemas.InboxPrefix("observer", "eve"), i), req); err != nil {
			t.Fatal(err)
		}
	}
	eve.Flush()
	victim := client.NewRemote(s.Connect(t, "observer", "victim"), client.Config{})
	if err := victim.Replay(t.Context(), []string{"watched"}, client.From{}, false, func(client.Replayed, *client.Gap) error { return nil }); err != nil {
		t.Errorf("another observer's replay while one leaves 1,100 unanswered: %v", err)
	}
}

// A replay naming one agent ten thousand times made twenty thousand
// reads of the stream before the server refused the overlapping readers
// (0.4 s of the coordinator's CPU each, 64 at once per caller). An agent
// named twice is refused before anything is read or held.
func TestFabricReplayRefusesAnAgentNamedTwice(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	storeEvents(t, s, "twice", 1)
	r := client.NewRemote(s.Connect(t, broker.RoleObserver, "repeater"), client.Config{})
	err := r.Replay(t.Context(), []string{"twice", "other", "twice"}, client.From{}, false, func(client.Replayed, *client.Gap) error { return nil })
	if schemas.CodeOf(err) != schemas.CodeInvalid || !strings.Contains(err.Error(), "agent twice is named twice") {
		t.Errorf("a replay naming an agent twice: %v; want it refused, naming the agent", err)
	}
}
