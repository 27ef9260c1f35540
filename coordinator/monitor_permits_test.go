package coordinator_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// The monitor denies a request that waits past its deadline once its node
// is gone, whether it was asked before the monitor started or after. It
// learns what waits from a watch of the bucket: a week of answered
// requests (an agent keeps its latest 512) is read once, not again every
// second, which with a few thousand of them kept the monitor's loop, the
// one that finds nodes lost, busy reading.
func TestMonitorDeniesOverdueRequestsWithoutReadingTheBucketAgain(t *testing.T) {
	t.Parallel()
	f := newCloseFabric(t)
	permits, err := f.js.KeyValue(t.Context(), schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().UnixNano()) / 1e9
	const answered = 2000
	for i := range answered {
		rec := schemas.PermitRecord{AgentID: fmt.Sprintf("a%d", i%20), RequestID: fmt.Sprintf("r%d", i), Node: "gone", Tool: "Bash",
			AskedAt: now - 60, Deadline: now - 30, Answer: &schemas.PermitAnswer{Decision: schemas.DecisionAllow, By: "test", At: now - 50}}
		putJSON(t, permits, schemas.PermitKey(rec.AgentID, rec.RequestID), rec)
	}
	waiting := func(agent, request, node string, deadline float64) {
		t.Helper()
		putJSON(t, permits, schemas.PermitKey(agent, request), schemas.PermitRecord{AgentID: agent, RequestID: request, Node: node, Tool: "Bash", AskedAt: now, Deadline: deadline})
	}
	answer := func(agent, request string) *schemas.PermitAnswer {
		t.Helper()
		e, err := permits.Get(t.Context(), schemas.PermitKey(agent, request))
		if err != nil {
			t.Fatalf("permission request %s of %s: %v", request, agent, err)
		}
		var rec schemas.PermitRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Answer
	}
	waiting("early", "p1", "gone", now-1)
	// A node that beats.
	nodes, err := f.js.KeyValue(t.Context(), schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	beat, _ := json.Marshal(schemas.NodeRecord{Name: "here"})
	if _, err := nodes.Put(t.Context(), "here", beat); err != nil {
		t.Fatal(err)
	}
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for {
			select {
			case <-t.Context().Done():
				return
			case <-time.After(300 * time.Millisecond):
				nodes.Put(t.Context(), "here", beat)
			}
		}
	}()
	t.Cleanup(func() { <-beating })

	// What reads the permits bucket (a get, a consumer made to list its
	// keys or watch it), counted from here.
	var reads atomic.Int64
	sub, err := f.conn().Subscribe("$JS.API.>", func(m *nats.Msg) {
		if strings.Contains(m.Subject, "KV_"+schemas.PermitsBucket) {
			reads.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })

	f.monitor(nil, 100*time.Millisecond)
	poll.Until(t, 30*time.Second, "the request asked before the monitor started to be denied", func() bool {
		a := answer("early", "p1")
		return a != nil && a.Decision == schemas.DecisionDeny && a.By == "coordinator"
	})
	// Asked after it started, its deadline to come; a request of a node
	// that is not gone waits on.
	waiting("late", "p2", "gone", float64(time.Now().Add(time.Second).UnixNano())/1e9)
	waiting("kept", "p3", "here", now-1)
	poll.Until(t, 30*time.Second, "the request asked after the monitor started to be denied at its deadline", func() bool {
		a := answer("late", "p2")
		return a != nil && a.Decision == schemas.DecisionDeny
	})

	before := reads.Load()
	time.Sleep(3 * time.Second) // three of the monitor's rounds
	if n := reads.Load() - before; n > 10 {
		t.Errorf("in three seconds with nothing to deny, the monitor made %d requests of the permits bucket (it holds %d records)", n, answered+3)
	}
	if a := answer("kept", "p3"); a != nil {
		t.Errorf("the request of a node that is not gone was answered: %+v", a)
	}
	if a := answer("a0", "r0"); a == nil || a.Decision != schemas.DecisionAllow {
		t.Errorf("an answered request was answered again: %+v", a)
	}
}
