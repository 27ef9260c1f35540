package node_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// With the default config a node keeps ten dead agents for review
// (Kaimon §7.2); past ten, the oldest by last activity are forgotten, by
// the node and in the fabric's records.
func TestTenDeadAgentsKeptByDefault(t *testing.T) {
	t.Parallel()
	f := startNode(t, fixtureOptions{claude: fakeCLI("echo")})
	var ids []string
	for i := range 12 {
		id := f.open(schemas.OpenRequest{ID: fmt.Sprintf("dead-%02d", i)})
		ids = append(ids, id)
		if rep, err := f.fabric.Close(f.ctx(30*time.Second), schemas.AgentRequest{AgentID: id}); err != nil || !rep.Closed {
			t.Fatalf("close %s: %+v %v", id, rep, err)
		}
		// Close returns once the agent is dead and retired, so the node's
		// list is settled.
		var kept []string
		for _, r := range nodeList(t, f) {
			kept = append(kept, r.ID)
			if r.Status != schemas.StatusDead {
				t.Errorf("%s is %s after its close", r.ID, r.Status)
			}
		}
		slices.Sort(kept)
		want := ids[max(0, len(ids)-10):]
		if !slices.Equal(kept, want) {
			t.Fatalf("after closing %d agents the node keeps %v, want the newest ten %v", len(ids), kept, want)
		}
	}
	for _, id := range ids[:2] {
		var rec schemas.AgentRecord
		err := f.ask(schemas.VerbStatus, schemas.AgentRequest{AgentID: id}, &rec)
		if schemas.CodeOf(err) != schemas.CodeNotFound || err.Error() != "no such agent: "+id {
			t.Errorf("status of forgotten %s: %v", id, err)
		}
		poll.Until(t, 10*time.Second, "the fabric forgets "+id, func() bool {
			_, err := f.fabric.Record(f.ctx(5*time.Second), id)
			return schemas.CodeOf(err) == schemas.CodeNotFound
		})
	}
	for _, id := range ids[2:] {
		rec, err := f.fabric.Status(f.ctx(10*time.Second), id)
		if err != nil || rec.Status != schemas.StatusDead {
			t.Errorf("status of kept %s: %+v %v", id, rec, err)
		}
	}
	// What the bucket keeps of a forgotten agent is one marker, carrying
	// its last record, that goes when the stream's events of it go (the
	// stream's age limit): nothing of it is kept for good.
	recs, err := f.js.Stream(f.ctx(10*time.Second), "KV_"+schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	events, err := f.js.Stream(f.ctx(10*time.Second), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:2] {
		subject := "$KV." + schemas.AgentsBucket + "." + id
		info, err := recs.Info(f.ctx(10*time.Second), jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		if n := info.State.Subjects[subject]; n != 1 {
			t.Errorf("the bucket keeps %d messages of forgotten %s, want its marker alone", n, id)
		}
		m, err := recs.GetLastMsgForSubject(f.ctx(10*time.Second), subject)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprint(int64(events.CachedInfo().Config.MaxAge / time.Second))
		if op, ttl := m.Header.Get("KV-Operation"), m.Header.Get(jetstream.MsgTTLHeader); op != "DEL" || ttl != want || len(m.Data) == 0 {
			t.Errorf("forgotten %s's marker: operation %q, TTL %q (want %s s, the stream's age limit), %d bytes of record", id, op, ttl, want, len(m.Data))
		}
	}
	// agent_output and agent_status of a forgotten agent answer from its
	// events in the stream, as Kaimon's do from its event log.
	out, err := f.fabric.Output(f.ctx(10*time.Second), schemas.OutputRequest{AgentID: ids[0]})
	if err != nil || out.Status != schemas.StatusDead || !out.Done {
		t.Errorf("output of a forgotten agent: %+v %v", out, err)
	}
	rec, err := f.fabric.Status(f.ctx(10*time.Second), ids[0])
	if err != nil || rec.Status != schemas.StatusDead || rec.ID != ids[0] || rec.Turn != 0 || rec.Node != "n1" {
		t.Errorf("status of a forgotten agent: %s %v", mustJSON(rec), err)
	}
	// Its model, cwd, policy and event log are said, as its node last
	// wrote them (the marker that forgot it carries them), and the
	// event log is still on disk.
	if rec.Model == "" || rec.CWD == "" || rec.EventLog == "" || rec.Policy == nil {
		t.Errorf("status of a forgotten agent lacks what its node knew: %s", mustJSON(rec))
	} else if _, err := os.Stat(rec.EventLog); err != nil {
		t.Errorf("the forgotten agent's event log: %v", err)
	}
	schematest.ControlValue(t, "agent_record", rec)
}
