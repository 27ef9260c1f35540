package client_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// The lists a dashboard, the TUI and every `shoal list` or `shoal pending`
// ask for read their bucket in one pass, not with a request per record: a
// fleet of a thousand agents, or a week of answered permission requests,
// was a thousand requests at every refresh.
func TestListsReadTheirBucketInOnePass(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := natstest.JetStream(t, srv)
	f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bucket := func(name string) jetstream.KeyValue {
		kv, err := js.KeyValue(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	put := func(kv jetstream.KeyValue, key string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), key, b); err != nil {
			t.Fatal(err)
		}
	}
	const n = 300
	agents, permits, jobs, budgets := bucket(schemas.AgentsBucket), bucket(schemas.PermitsBucket), bucket(schemas.JobsBucket), bucket(schemas.BudgetsBucket)
	now := float64(time.Now().Unix())
	for i := range n {
		id := fmt.Sprintf("a%03d", i)
		put(agents, id, schemas.AgentRecord{ID: id, Node: "n1", Status: schemas.StatusIdle, CWD: "/tmp", CreatedAt: now + float64(i), EventLog: id + ".jsonl",
			Usage: schemas.Usage{OutputTokens: int64(i + 1)}})
		put(budgets, id, schemas.Budget{Tokens: 1000})
		rec := schemas.PermitRecord{AgentID: id, RequestID: "r1", Node: "n1", Tool: "Bash", AskedAt: now + float64(i)}
		if i%100 != 7 {
			rec.Answer = &schemas.PermitAnswer{Decision: schemas.DecisionAllow, By: "test", At: now}
		}
		put(permits, schemas.PermitKey(id, "r1"), rec)
		put(jobs, fmt.Sprintf("j%03d", i), schemas.JobRecord{ID: fmt.Sprintf("j%03d", i), Status: schemas.JobSucceeded, StartedAt: now + float64(i)})
	}

	// The requests of the JetStream API that name the buckets.
	var reads atomic.Int64
	sub, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		for _, b := range []string{schemas.AgentsBucket, schemas.PermitsBucket, schemas.JobsBucket, schemas.BudgetsBucket} {
			if strings.Contains(m.Subject, "KV_"+b) {
				reads.Add(1)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	counted := func(what string, read func() int, want int) {
		t.Helper()
		before := reads.Load()
		got := read()
		nc.Flush()
		if got != want {
			t.Errorf("%s: %d, want %d", what, got, want)
		}
		if r := reads.Load() - before; r > 10 {
			t.Errorf("%s made %d requests of its bucket for %d records", what, r, n)
		}
	}
	counted("the agents' list", func() int {
		recs, err := f.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == n && (recs[0].ID != "a000" || recs[n-1].ID != fmt.Sprintf("a%03d", n-1)) {
			t.Errorf("the agents' list is not by creation: %s … %s", recs[0].ID, recs[n-1].ID)
		}
		return len(recs)
	}, n)
	counted("the permission requests waiting", func() int {
		rep, err := f.Pending(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Requests {
			if r.Answer != nil {
				t.Errorf("an answered request is listed as waiting: %+v", r)
			}
		}
		return len(rep.Requests)
	}, n/100)
	counted("the budgets", func() int {
		rep, err := f.Budgets(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range rep.Budgets {
			var i int
			if _, err := fmt.Sscanf(l.AgentID, "a%03d", &i); err != nil || l.Used.OutputTokens != int64(i+1) || l.Budget.Tokens != 1000 {
				t.Errorf("budget line %+v: want agent a%03d's own use and budget", l, i)
				break
			}
		}
		return len(rep.Budgets)
	}, n)
	counted("the jobs", func() int {
		js, err := f.Jobs(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return len(js)
	}, n)
}
