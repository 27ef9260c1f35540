package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/schemas"
)

// shoal up is SIGKILLed the moment its monitor has written the first of
// a lost node's agents' records dead (keeping the close): that close, and
// any after it, are cut off. Started again on the same store, its grace
// sweep (three TTLs) must leave every agent dead in its record, no record
// keeping a close, and every stream numbered 1..last_event once each,
// ending with status dead.
func TestCoordinatorKilledMidCloseLeavesEveryStreamDead(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	port := strconv.Itoa(freePort(t))
	p := &pool{t: t, dir: t.TempDir(), fake: fakemodel.Start(t, fakemodel.Config{}), claude: peers.Claude.Command(t)[0]}
	upArgs := []string{"up", "--port", port, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--node-ttl", ttl.String()}
	p.up = startShoal(t, p.dir, nil, upArgs...)
	p.url = strings.TrimPrefix(p.up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	p.up.waitLine("shoal: ready")
	p.ready = time.Now()

	n := p.node("doomed")
	var ids []string
	for range 5 {
		id, _ := p.openOn("--node", "doomed")
		ids = append(ids, id)
	}
	f := openLeaseFabric(t, p.url)
	w, err := f.records.WatchAll(t.Context(), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan string, 1)
	go func() {
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			var rec schemas.AgentRecord
			if json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead && rec.Closing != nil {
				p.up.cmd.Process.Kill()
				killed <- rec.ID
				return
			}
		}
	}()
	n.cmd.Process.Kill()
	<-n.done
	var first string
	select {
	case first = <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the monitor never closed the lost node's agents")
	}
	<-p.up.done
	w.Stop()
	var cut []string
	for _, id := range ids {
		e, err := f.records.Get(t.Context(), id)
		if err != nil {
			continue // the connection is gone with the server
		}
		cut = append(cut, fmt.Sprintf("%s: %s", id, e.Value()))
	}
	t.Logf("killed at %s's close", first)

	p.up = startShoal(t, p.dir, nil, upArgs...)
	p.up.waitLine("shoal: ready")
	f = openLeaseFabric(t, p.url)
	state := func(id string) (schemas.AgentRecord, []string, string) {
		e, err := f.records.Get(t.Context(), id)
		var rec schemas.AgentRecord
		if err != nil || json.Unmarshal(e.Value(), &rec) != nil {
			return rec, nil, "no record"
		}
		c, err := f.stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
		if err != nil {
			return rec, nil, err.Error()
		}
		var got []string
		want := uint64(1)
		problem := ""
		var last schemas.Event
		for {
			msg, err := c.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				break
			}
			_, num, _ := schemas.ParseMsgID(msg.Headers().Get(schemas.HeaderMsgID))
			ev, _ := schemas.Decode(msg.Data())
			last = ev
			got = append(got, fmt.Sprintf("%d %s %s", num, msg.Headers().Get(schemas.HeaderNode), ev.Kind()))
			if num != want && problem == "" {
				problem = fmt.Sprintf("event %d stored where %d was due", num, want)
			}
			want = num + 1
		}
		switch {
		case problem != "":
		case rec.Status != schemas.StatusDead || rec.Closing != nil:
			problem = fmt.Sprintf("record %s, closing %+v", rec.Status, rec.Closing)
		case want-1 != rec.LastEvent:
			problem = fmt.Sprintf("the stream ends at %d, the record at %d", want-1, rec.LastEvent)
		default:
			if st, ok := last.Payload.(schemas.Status); !ok || st.Status != schemas.StatusDead {
				problem = "the stream does not end dead"
			}
		}
		return rec, got, problem
	}
	for _, id := range ids {
		rec, got, _ := state(id)
		t.Logf("after the restart, before its sweep: %s %s closing=%v last_event=%d; stream %d events, last %v", id, rec.Status, rec.Closing != nil, rec.LastEvent, len(got), got[max(0, len(got)-1):])
	}
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		done := true
		for _, id := range ids {
			if _, _, problem := state(id); problem != "" {
				done = false
			}
		}
		if done {
			break
		}
	}
	for _, id := range ids {
		_, got, problem := state(id)
		if problem != "" {
			t.Errorf("%s: %s\n%s", id, problem, strings.Join(got, "\n"))
		}
	}
	if t.Failed() {
		t.Logf("records when the coordinator was killed:\n%s", strings.Join(cut, "\n"))
	}
}
