package client_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// A client that watches the permission requests (the coordinator's
// fabric service, the dashboard and MCP, the TUI) lists what waits from
// memory: the TUI and the dashboard ask every second, and the bucket
// keeps each agent's latest answered requests for days, which a read per
// call took whole each time. What it lists follows the bucket, across a
// restart of the server, and leaves out at once what it answered itself.
func TestWatchedPermitsAreListedWithoutReadingTheBucket(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := natstest.JetStream(t, srv)
	watcherConn := natstest.Connect(t, srv, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	f, err := client.NewDirect(watcherConn, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	kv := func(name string) jetstream.KeyValue {
		b, err := js.KeyValue(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	permits, agents := kv(schemas.PermitsBucket), kv(schemas.AgentsBucket)
	put := func(b jetstream.KeyValue, key string, v any) {
		t.Helper()
		raw, _ := json.Marshal(v)
		if _, err := b.Put(t.Context(), key, raw); err != nil {
			t.Fatal(err)
		}
	}
	now := float64(time.Now().Unix())
	request := func(agent, id string, asked float64) schemas.PermitRecord {
		return schemas.PermitRecord{AgentID: agent, RequestID: id, Node: "n1", Tool: "Bash", AskedAt: asked, Input: json.RawMessage(`{"command":"` + strings.Repeat("x", 2000) + `"}`)}
	}
	const answered = 400
	for i := range answered {
		rec := request(fmt.Sprintf("a%d", i%10), fmt.Sprintf("old%d", i), now-100)
		rec.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionAllow, By: "test", At: now - 90}
		put(permits, schemas.PermitKey(rec.AgentID, rec.RequestID), rec)
	}
	put(permits, schemas.PermitKey("a1", "w2"), request("a1", "w2", now-2))
	put(permits, schemas.PermitKey("a2", "w1"), request("a2", "w1", now-3))
	if err := f.WatchPermits(t.Context()); err != nil {
		t.Fatal(err)
	}

	waiting := func() []string {
		t.Helper()
		rep, err := f.Pending(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rep.Requests {
			out = append(out, schemas.PermitKey(r.AgentID, r.RequestID))
		}
		return out
	}
	var reads atomic.Int64
	sub, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		if strings.Contains(m.Subject, "KV_"+schemas.PermitsBucket) {
			reads.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	for range 50 {
		if got, want := waiting(), []string{"a2.w1", "a1.w2"}; !slices.Equal(got, want) {
			t.Fatalf("waiting: %v, want %v (oldest first)", got, want)
		}
	}
	nc.Flush()
	if r := reads.Load(); r != 0 {
		t.Errorf("50 lists of what waits made %d requests of the permits bucket", r)
	}

	// A request asked, another answered: the list follows.
	put(permits, schemas.PermitKey("a3", "w3"), request("a3", "w3", now-1))
	done := request("a2", "w1", now-3)
	done.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionDeny, By: "test", At: now}
	put(permits, schemas.PermitKey("a2", "w1"), done)
	poll.Until(t, 10*time.Second, "the list to follow the bucket", func() bool {
		return slices.Equal(waiting(), []string{"a1.w2", "a3.w3"})
	})

	// An answer this client gives is left out at once, though the node
	// writes it to the bucket only later.
	put(agents, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusWorking, CWD: "/tmp", CreatedAt: now, EventLog: "a1.jsonl"})
	write := make(chan schemas.PermitRecord, 1)
	node, err := nc.Subscribe(schemas.ControlSubject("n1", schemas.VerbPermit), func(m *nats.Msg) {
		var req schemas.PermitRequest
		json.Unmarshal(m.Data, &req)
		rec := schemas.Answered(request(req.AgentID, req.RequestID, now-2), schemas.PermitAnswer{Decision: req.Decision, By: req.By, At: now})
		b, _ := json.Marshal(schemas.PermitReply{Record: rec})
		m.Respond(b)
		write <- rec
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Unsubscribe() })
	nc.Flush()
	if _, err := f.Permit(t.Context(), schemas.PermitRequest{AgentID: "a1", RequestID: "w2", Decision: schemas.DecisionAllow, By: "test"}); err != nil {
		t.Fatal(err)
	}
	if got := waiting(); !slices.Equal(got, []string{"a3.w3"}) {
		t.Errorf("right after its answer: %v, want only a3.w3", got)
	}
	put(permits, schemas.PermitKey("a1", "w2"), <-write)
	poll.Until(t, 10*time.Second, "the answer's record to be seen", func() bool { return slices.Equal(waiting(), []string{"a3.w3"}) })

	// The server restarts; what changes after it is followed.
	srv = natstest.Restart(t, srv)
	nc2, js2 := natstest.JetStream(t, srv)
	_ = nc2
	permits2, err := js2.KeyValue(t.Context(), schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	put(permits2, schemas.PermitKey("a4", "w4"), request("a4", "w4", now))
	gone := request("a3", "w3", now-1)
	gone.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionAllow, By: "test", At: now}
	put(permits2, schemas.PermitKey("a3", "w3"), gone)
	poll.Until(t, 30*time.Second, "the list to follow the bucket after the server's restart", func() bool {
		return slices.Equal(waiting(), []string{"a4.w4"})
	})
}

// A request of an agent that died with it waiting (its node lost) stays
// listed until its deadline; answered, it said "node n1 is not reachable"
// (exit 4), as if answering later might do. It says the agent is dead.
func TestPermitOfADeadAgentSaysItIsDead(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := natstest.JetStream(t, srv)
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	put := func(bucket, key string, v any) {
		t.Helper()
		b, err := js.KeyValue(t.Context(), bucket)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(v)
		if _, err := b.Put(t.Context(), key, raw); err != nil {
			t.Fatal(err)
		}
	}
	now := float64(time.Now().Unix())
	put(schemas.AgentsBucket, "a1", schemas.AgentRecord{ID: "a1", Node: "n1", Status: schemas.StatusDead, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now})
	put(schemas.PermitsBucket, schemas.PermitKey("a1", "r1"), schemas.PermitRecord{AgentID: "a1", RequestID: "r1", Node: "n1", Tool: "Bash", AskedAt: now, Deadline: now + 600, Input: json.RawMessage(`{}`)})
	_, err = f.Permit(t.Context(), schemas.PermitRequest{AgentID: "a1", RequestID: "r1", Decision: schemas.DecisionAllow})
	if err == nil || !strings.Contains(err.Error(), "agent 'a1' is dead") {
		t.Errorf("answering a dead agent's request: %v", err)
	}
}
