package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/netproxy"
	"github.com/shoalfabric/shoal/internal/poll"
	"github.com/shoalfabric/shoal/schemas"
)

// leaseFabric is a test's own view of the fabric: the agents' records and
// the stream.
type leaseFabric struct {
	t       *testing.T
	js      jetstream.JetStream
	records jetstream.KeyValue
	stream  jetstream.Stream
}

func openLeaseFabric(t *testing.T, url string) *leaseFabric {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	records, err := js.KeyValue(t.Context(), schemas.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), schemas.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return &leaseFabric{t: t, js: js, records: records, stream: stream}
}

// streaming waits until the agent's last stored event is a streamed chunk.
func (f *leaseFabric) streaming(id string) {
	f.t.Helper()
	poll.Until(f.t, 60*time.Second, "the agent streams its turn", func() bool {
		m, err := f.stream.GetLastMsgForSubject(f.t.Context(), schemas.EventSubject(id))
		if err != nil {
			return false
		}
		ev, err := schemas.Decode(m.Data)
		return err == nil && ev.IsDelta()
	})
}

// dead waits until the stored record says dead.
func (f *leaseFabric) dead(id string) {
	f.t.Helper()
	poll.Until(f.t, 60*time.Second, "the coordinator takes the agent for lost", func() bool {
		var rec schemas.AgentRecord
		e, err := f.records.Get(f.t.Context(), id)
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Status == schemas.StatusDead
	})
}

// runningRecorded waits until the stored record of agent id says what
// its running turn has used (the coordinator closes the turn from the
// stored record; shoal status asks the node, which may not have written
// it yet).
func (f *leaseFabric) runningRecorded(id string) {
	f.t.Helper()
	poll.Until(f.t, 60*time.Second, "the record says what the running turn used", func() bool {
		var rec schemas.AgentRecord
		e, err := f.records.Get(f.t.Context(), id)
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Running != nil && schemas.TokensOf(*rec.Running) > 0
	})
}

// afterDeath counts the events of the agent not by the coordinator stored
// after the coordinator's dead status, and says the first.
func (f *leaseFabric) afterDeath(id string) (after int, first string) {
	f.t.Helper()
	after, first, _ = f.closing(id)
	return after, first
}

// closing is afterDeath, and the use the coordinator's cancelled result
// carries.
func (f *leaseFabric) closing(id string) (after int, first string, closedUse *schemas.Usage) {
	f.t.Helper()
	cons, err := f.stream.OrderedConsumer(f.t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{schemas.EventSubject(id)}})
	if err != nil {
		f.t.Fatal(err)
	}
	dead := false
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break
		}
		ev, err := schemas.Decode(m.Data())
		if err != nil {
			f.t.Fatal(err)
		}
		byCloser := m.Headers().Get(schemas.HeaderNode) == schemas.CloserName
		if byCloser || (dead && after < 3) {
			md, _ := m.Metadata()
			f.t.Logf("stored: %s by %s, %s, at %s", m.Headers().Get(schemas.HeaderMsgID), m.Headers().Get(schemas.HeaderNode), ev.Kind(), md.Timestamp.Format("15:04:05.000"))
		}
		if r, ok := ev.Payload.(schemas.Result); ok && byCloser {
			closedUse = r.Usage
		}
		if st, ok := ev.Payload.(schemas.Status); ok && byCloser && st.Status == schemas.StatusDead {
			dead = true
			continue
		}
		if dead && !byCloser {
			if after == 0 {
				first = m.Headers().Get(schemas.HeaderMsgID) + " " + string(ev.Kind())
			}
			after++
		}
	}
	if !dead {
		f.t.Fatal("no dead status by the coordinator in the stream")
	}
	return after, first, closedUse
}

// streamingBehindProxy starts a pool whose node, cut, reaches it through
// a proxy (given nodeArgs too), and an agent there streaming a long turn.
func streamingBehindProxy(t *testing.T, nodeArgs ...string) (p *pool, px *netproxy.Proxy, n *shoalProc, f *leaseFabric, id string) {
	t.Helper()
	p = startPool(t)
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("steadily ", 400), ChunkSize: 5, Delay: 15 * time.Millisecond})
	px = netproxy.Start(t, p.url)
	n = p.node("cut", append([]string{"--nats", px.URL()}, nodeArgs...)...)
	f = openLeaseFabric(t, p.url)
	id, _ = p.openOn()
	p.must("send", id, "Stream on.")
	f.streaming(id)
	return p, px, n, f, id
}

// A node cut off past its TTL (the connection reset, nothing in flight):
// the coordinator took its agent for lost. The operator stops the node
// (Ctrl-C) while it cannot reach the fabric; the network comes back while
// it shuts down. Stopping closed the agent on the node, and its check of
// the records asked only the living agents: what the agent printed during
// the cut, and its close, were stored after the coordinator's dead status.
// Every agent whose record the node holds is checked, dead ones included.
func TestLeaseNodeStoppedWhileLapsedStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	_, px, n, f, id := streamingBehindProxy(t)
	px.Cut()
	f.dead(id)
	time.Sleep(time.Second)
	n.cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(3 * time.Second) // the node closes its agents, and waits for the fabric to store their events
	px.Restore()
	select {
	case <-n.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the node did not stop")
	}
	if after, first := f.afterDeath(id); after > 0 {
		t.Errorf("the node, stopped while cut off past its TTL, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
	}
}

// A node cut off past its TTL while its agent streams is taken for lost;
// it dies there (killed, or stopped while the fabric was still away, as
// the node's own warning says: "the journal keeps what is not stored, and
// the next start settles the rest"). Started again once the network is
// back, it published what its journal kept of the agent the coordinator
// closed, after the coordinator's dead status. A journal's events of a
// life whose stream ended with a death are not sent again.
func TestLeaseRestartedNodeStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	p, px, n, f, id := streamingBehindProxy(t)
	px.Cut()
	f.dead(id)
	time.Sleep(time.Second) // the agent goes on printing into the journal
	n.cmd.Process.Kill()
	<-n.done
	px.Restore()
	again := p.node("cut")
	time.Sleep(3 * time.Second)
	if after, first := f.afterDeath(id); after > 0 {
		t.Errorf("the node, restarted after it was taken for lost, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
		t.Log(again.stderrText())
	}
}

// descendants lists the processes under pid whose command line holds
// word.
func descendants(pid int, word string) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			child, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child)); strings.Contains(string(cmd), word) {
				out = append(out, child)
			}
			out = append(out, descendants(child, word)...)
		}
	}
	return out
}

// The same without an operator: the agent's CLI exits (crashes) while
// the node is cut off past its TTL, and the node closes the agent itself.
// A dead record the node did not write is the coordinator's close: what
// the agent printed during the cut and the node's own close of it are
// not stored after it.
func TestLeaseAgentDyingWhileLapsedStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	_, px, n, f, id := streamingBehindProxy(t)
	px.Cut()
	f.dead(id)
	clis := descendants(n.cmd.Process.Pid, "claude")
	if len(clis) == 0 {
		t.Fatal("no claude process under the node")
	}
	for _, pid := range clis {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	poll.Until(t, 30*time.Second, "the node sees its agent's CLI gone", func() bool {
		return len(descendants(n.cmd.Process.Pid, "claude")) == 0
	})
	time.Sleep(time.Second)
	px.Restore()
	poll.Until(t, 60*time.Second, "the node checks its agents", func() bool {
		return strings.Contains(n.stderrText(), "the node's agents checked")
	})
	time.Sleep(2 * time.Second)
	if after, first := f.afterDeath(id); after > 0 {
		t.Errorf("the node, whose agent's CLI exited while it was cut off past its TTL, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
	}
}

// A node stopped (SIGSTOP) past its TTL and let go the moment its entry
// expires: the coordinator's monitor and the node's check race. The
// monitor's sweep reads every agent record of the fabric before it closes
// one; a fabric with a few hundred records (other nodes' agents, dead
// ones kept) widens the window. A check that only read the records lost
// it every time: the node sent on, and the monitor's close came a moment
// later. The node now beats and then writes each record (compare-and-set),
// and the monitor looks for the node's entry between its read of a record
// and its write: one of the two finds the other.
func TestLeaseNodeBackAtTheExpiryStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("steadily ", 800), ChunkSize: 5, Delay: 15 * time.Millisecond})
	n := p.node("sleeper")
	f := openLeaseFabric(t, p.url)
	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	nodes, err := js.KeyValue(t.Context(), schemas.NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Other agents' records, as a busy fabric holds.
	for i := range 400 {
		other := schemas.AgentRecord{ID: fmt.Sprintf("0ther%03d", i), Node: "elsewhere", Status: schemas.StatusDead}
		b, _ := json.Marshal(other)
		if _, err := f.records.Put(t.Context(), other.ID, b); err != nil {
			t.Fatal(err)
		}
	}
	w, err := nodes.Watch(t.Context(), "sleeper", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	id, _ := p.openOn()
	p.must("send", id, "Stream on.")
	f.streaming(id)
	n.cmd.Process.Signal(syscall.SIGSTOP)
	defer n.cmd.Process.Signal(syscall.SIGCONT)
	for e := range w.Updates() {
		if e != nil && e.Operation() != jetstream.KeyValuePut {
			break
		}
	}
	n.cmd.Process.Signal(syscall.SIGCONT)
	// The node back, and the coordinator that saw it lost, agree: either
	// the coordinator closed the agent and the node stores nothing of it
	// after, or the node came back first and its agent goes on, closed by
	// nobody.
	var rec schemas.AgentRecord
	poll.Until(t, 60*time.Second, "the agent closed, or its turn ended on its node", func() bool {
		e, err := f.records.Get(t.Context(), id)
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil &&
			(rec.Status == schemas.StatusDead || (rec.Status == schemas.StatusIdle && rec.Turn >= 1))
	})
	if rec.Status == schemas.StatusIdle {
		if m, err := f.stream.GetLastMsgForSubject(t.Context(), schemas.EventSubject(id)); err != nil || m.Header.Get(schemas.HeaderNode) == schemas.CloserName {
			t.Errorf("the node came back first and its turn ended, but the stream ends with the coordinator's close: %v", err)
		}
		return
	}
	time.Sleep(3 * time.Second) // what the node would send after the death
	if after, first := f.afterDeath(id); after > 0 {
		t.Errorf("the node, back as its entry expired, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
		t.Log(n.stderrText())
	}
}

// A node cut off by a network that holds what was sent (no reset: the
// link went, then came back) while its agent streams. The node sent
// events within its lease after the link went; they reached the server
// only when the path came back, after the coordinator took the node for
// lost and wrote the agent's dead status, and were stored after it (the
// lease is judged when an event is sent, not when it arrives). The
// coordinator now closes the node's connections to its server before it
// closes the node's agents: what they held is dropped with them.
func TestLeaseBlackholedNodeStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		way  string
		hold time.Duration
	}{{"async", time.Second}, {"batches", time.Second}} {
		t.Run(c.way, func(t *testing.T) {
			t.Parallel()
			_, px, n, f, id := streamingBehindProxy(t, "--publish", c.way)
			px.Freeze()
			f.dead(id)
			time.Sleep(c.hold)
			px.Thaw()
			poll.Until(t, 60*time.Second, "the node, back, says the fabric took its agent for lost", func() bool {
				return strings.Contains(n.stderrText(), "the fabric took this agent for lost")
			})
			time.Sleep(2 * time.Second)
			if after, first := f.afterDeath(id); after > 0 {
				t.Errorf("the node, cut off then back, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
			}
		})
	}
}

// A node's link resets just after a heartbeat and the node reconnects at
// once (its lease still runs: a reconnect is no lapse) and streams on;
// then the link blackholes before the next beat, holding what the node
// sent within its lease on the new connection. The entry expires. The
// monitor closed only the connections made before the node's last
// heartbeat, so this one was left, and once the link came back what it
// held (thousands of events, the turn's result among them, which the
// coordinator had already cancelled) was stored after the dead status;
// and the held beats, acknowledged late, renewed the node's lease, so it
// never lapsed. The monitor now closes every connection of the node's
// life (its heartbeat names its instance, as its connections' names do),
// and a beat acknowledged after the lease ran out renews nothing.
func TestLeaseNodeReconnectedAfterItsLastBeatStoresNothingAfterTheDeath(t *testing.T) {
	t.Parallel()
	for _, way := range []string{"async", "batches"} {
		t.Run(way, func(t *testing.T) {
			t.Parallel()
			p := startPoolTTL(t, 9*time.Second)
			p.fake.Script(fakemodel.Reply{Text: strings.Repeat("steadily ", 1500), ChunkSize: 5, Delay: 15 * time.Millisecond})
			px := netproxy.Start(t, p.url)
			p.node("cut", "--nats", px.URL(), "--publish", way)
			f := openLeaseFabric(t, p.url)
			id, _ := p.openOn()
			p.must("send", id, "Stream on.")
			f.streaming(id)
			beats := f.beats("cut")
			// The reset, the reconnect and the blackhole must fall between
			// two beats (3 s apart): tried again after a beat that came
			// between them.
			for try := 0; ; try++ {
				if try == 5 {
					t.Fatal("a heartbeat came between the reconnect and the blackhole five times: the scenario needs none")
				}
				<-beats
				stored := f.lastSeq(id)
				px.Cut()
				px.Restore()
				poll.Until(t, 5*time.Second, "the node streams again on a new connection", func() bool { return f.lastSeq(id) > stored+5 })
				px.Freeze()
				select {
				case <-beats:
					px.Thaw()
					continue
				default:
				}
				break
			}
			f.dead(id)
			px.Thaw()
			time.Sleep(3 * time.Second)
			if after, first := f.afterDeath(id); after > 0 {
				t.Errorf("the node, reconnected after its last beat and then blackholed, stored %d events of its agent after the coordinator's dead status (the first %s)", after, first)
			}
		})
	}
}

// beats are the puts of node's heartbeat entry from now on.
func (f *leaseFabric) beats(node string) <-chan struct{} {
	f.t.Helper()
	nodes, err := f.js.KeyValue(f.t.Context(), schemas.NodesBucket)
	if err != nil {
		f.t.Fatal(err)
	}
	w, err := nodes.Watch(f.t.Context(), node, jetstream.UpdatesOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { w.Stop() })
	out := make(chan struct{}, 16)
	go func() {
		for e := range w.Updates() {
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// lastSeq is the stream sequence of the agent's last stored event.
func (f *leaseFabric) lastSeq(id string) uint64 {
	m, err := f.stream.GetLastMsgForSubject(f.t.Context(), schemas.EventSubject(id))
	if err != nil {
		return 0
	}
	return m.Sequence
}

// A node cut off while its agent streams is killed, the agent's events
// since in its journal; meanwhile the coordinator, taking it for lost,
// has written the agent's record dead but not yet stored its closing
// events (they follow the record's write). The node, restarted, read the
// stream, found no death there, and sent the journal's events at once,
// before any record write of its own decided whose the life was: stored
// under the numbers the coordinator had given its closing events, which
// the stream then dropped as copies, so the agent's stream never said
// dead. A restart sends nothing before it has read the records, and
// nothing of a life the coordinator closed.
func TestLeaseRestartSendsNothingOfALifeTheCoordinatorClosed(t *testing.T) {
	t.Parallel()
	p, f, id, rec, rev := killedWhileCut(t)
	stored := f.lastSeq(id)
	// The coordinator's close, as far as its record write.
	dead := rec.Dead()
	dead.ClosedBy = schemas.CloserName
	b, _ := json.Marshal(dead)
	if _, err := f.records.Update(t.Context(), id, b, rev); err != nil {
		t.Fatal(err)
	}
	again := p.node("cut")
	time.Sleep(3 * time.Second)
	if now := f.lastSeq(id); now != stored {
		t.Errorf("the node, restarted, stored events of a life the coordinator had closed (the stream's last event of it went from sequence %d to %d: %s)", stored, now, f.lastID(id))
		t.Log(again.stderrText())
	}
	if !strings.Contains(again.stderrText(), "what the journal kept of it is dropped") {
		t.Errorf("the restarted node does not say it dropped what its journal kept of the agent:\n%s", again.stderrText())
	}
}

// lastID is the message id and kind of the agent's last stored event.
func (f *leaseFabric) lastID(id string) string {
	m, err := f.stream.GetLastMsgForSubject(f.t.Context(), schemas.EventSubject(id))
	if err != nil {
		return err.Error()
	}
	ev, _ := schemas.Decode(m.Data)
	return m.Header.Get(schemas.HeaderMsgID) + " " + string(ev.Kind())
}

// A node cut off mid-turn is killed with the turn's
// events in its journal; the coordinator closes the agent (record dead,
// closed_by, its closing events stored, as closeLost does); the id is
// then reopened on another node (its claim, numbering after the
// coordinator's close). The first node, restarted, must send nothing of
// the life the coordinator closed: the record no longer names it, so
// reconcileRecords does not look, and resume's closedWithout takes the
// claim's events_before == the dead tail for "a later life of this node's"
// and sent the journal's events under the new life's numbers. A journal's
// events of an agent whose record names another node are dropped.
func TestLeaseRestartSendsNothingOfAClosedLifeReopenedElsewhere(t *testing.T) {
	t.Parallel()
	p, f, id, rec, rev := killedWhileCut(t)
	// The coordinator's close, as coordinator.closeLost makes it.
	nc, err := nats.Connect(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tail, _, err := client.StreamTail(t.Context(), nc, f.stream, id)
	if err != nil {
		t.Fatal(err)
	}
	dead := schemas.CloseLost(rec, tail, "node cut was lost", schemas.CloserName)
	seq, events, err := dead.ClosingEvents()
	if err != nil {
		t.Fatal(err)
	}
	dead.Closing = nil // stored below
	b, _ := json.Marshal(dead)
	rev, err = f.records.Update(t.Context(), id, b, rev)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		seq++
		env, err := schemas.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(schemas.EventSubject(id))
		msg.Data = env
		msg.Header.Set(schemas.HeaderMsgID, schemas.MsgID(id, seq))
		msg.Header.Set(schemas.HeaderNode, schemas.CloserName)
		msg.Header.Set(schemas.HeaderClosedFor, "cut")
		msg.Header.Set(schemas.HeaderTime, time.Now().UTC().Format(time.RFC3339Nano))
		if _, err := f.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	closedAt := f.lastSeq(id)

	// The id reopened on another node: its claim, as client.claim writes it.
	now := float64(time.Now().Unix())
	claim := schemas.AgentRecord{ID: id, Status: schemas.StatusStarting, Model: rec.Model, CWD: rec.CWD, CreatedAt: now, LastActivity: now,
		Node: "elsewhere", RequestID: "req-reopened-elsewhere", UsageBefore: dead.NextLife()}
	claim.EventsBefore, claim.TurnsBefore = dead.NextNumbers()
	b, _ = json.Marshal(claim)
	if _, err := f.records.Update(t.Context(), id, b, rev); err != nil {
		t.Fatal(err)
	}

	again := p.node("cut")
	time.Sleep(3 * time.Second)
	if now := f.lastSeq(id); now != closedAt {
		after, first := f.afterDeath(id)
		t.Errorf("the node, restarted, stored %d events of a life the coordinator had closed, under the numbers of the id's new life on another node (first %s; stream sequence %d -> %d)",
			after, first, closedAt, now)
		t.Log(again.stderrText())
	}
}

// killedWhileCut starts a pool whose coordinator takes no node for lost
// within a test, and a node behind a proxy whose agent streams a turn;
// cuts the node off, lets the agent print into its journal for a second
// and SIGKILLs the node. It returns the agent's stored record and its
// revision.
func killedWhileCut(t *testing.T) (p *pool, f *leaseFabric, id string, rec schemas.AgentRecord, rev uint64) {
	t.Helper()
	p = startPoolTTL(t, time.Minute)
	p.fake.Script(fakemodel.Reply{Text: strings.Repeat("steadily ", 400), ChunkSize: 5, Delay: 15 * time.Millisecond})
	px := netproxy.Start(t, p.url)
	n := p.node("cut", "--nats", px.URL())
	f = openLeaseFabric(t, p.url)
	id, _ = p.openOn()
	p.must("send", id, "Stream on.")
	f.streaming(id)
	px.Cut()
	time.Sleep(time.Second) // the agent goes on printing into the journal
	n.cmd.Process.Kill()
	<-n.done
	e, err := f.records.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return p, f, id, rec, e.Revision()
}
