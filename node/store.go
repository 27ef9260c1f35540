package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// store is how a node reaches the fabric's shared state: the stream its
// events go to, the agent records and its own heartbeat entry. A node
// with the coordinator's rights uses JetStream directly; a confined node
// (scoped credentials) goes through the coordinator's relay, which checks
// that it only writes what it owns.
type store interface {
	// eventSubject is where the node publishes an agent's events; the
	// stream acknowledges them either way.
	eventSubject(agent string) string
	// lastEvents reports the last stored event number of each agent.
	lastEvents(ctx context.Context, ids []string) (map[string]uint64, error)
	// tails reports how each agent's stream ends.
	tails(ctx context.Context, ids []string) (map[string]schemas.Tail, error)

	// Agent records, with compare-and-set. create fails with
	// jetstream.ErrKeyExists when the key is live, update with the
	// wrong-last-sequence API error when the revision moved, get with
	// jetstream.ErrKeyNotFound.
	create(ctx context.Context, id string, val []byte) (uint64, error)
	update(ctx context.Context, id string, val []byte, rev uint64) (uint64, error)
	get(ctx context.Context, id string) (entry, error)
	remove(ctx context.Context, id string, rev uint64) error
	// owned lists the records that name this node.
	owned(ctx context.Context) ([]entry, error)

	// hello says whether a running node answers to this name already,
	// how long a heartbeat entry lives and, through the relay, what the
	// node needs to give its agents MCP identities of their own.
	hello(ctx context.Context) (schemas.RelayHelloReply, error)
	// beat writes the node's entry; leave removes it.
	beat(ctx context.Context, rec []byte) error
	leave(ctx context.Context) error

	// putPermit writes a permission request of one of its agents, or its
	// answer, to PermitsBucket.
	putPermit(ctx context.Context, rec schemas.PermitRecord) error

	// getBundle reads bundle name, the one agent is opened from, into w;
	// putBundle stores a bundle of agent's work.
	getBundle(ctx context.Context, agent, name string, w io.Writer) error
	putBundle(ctx context.Context, agent, name, desc string, r io.Reader) error

	// allowance is what a turn of agent is held to when it starts: its
	// budget, and the fleet's and the labels' with what they have spent
	// (a node that reaches JetStream directly names its life and labels;
	// the relay takes the node's from its entry).
	allowance(ctx context.Context, agent, instance string, labels []string) (schemas.Allowance, error)
}

// entry is an agent record with its revision.
type entry struct {
	id    string
	rev   uint64
	value []byte
}

// directStore reaches JetStream directly.
type directStore struct {
	nc *nats.Conn
	js jetstream.JetStream
	// budgets is BudgetsBucket, once a send has looked it up.
	budgetsMu sync.Mutex
	budgets   jetstream.KeyValue
	node      string
	agents    jetstream.KeyValue
	nodes     jetstream.KeyValue
	events    jetstream.Stream
	permits   jetstream.KeyValue
}

func newDirectStore(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, node string) (*directStore, error) {
	s := &directStore{nc: nc, js: js, node: node}
	var err error
	if s.agents, err = js.KeyValue(ctx, schemas.AgentsBucket); err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", schemas.AgentsBucket, err)
	}
	if s.nodes, err = js.KeyValue(ctx, schemas.NodesBucket); err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", schemas.NodesBucket, err)
	}
	if s.events, err = js.Stream(ctx, schemas.StreamName); err != nil {
		return nil, fmt.Errorf("open stream %s: %w", schemas.StreamName, err)
	}
	if s.permits, err = js.KeyValue(ctx, schemas.PermitsBucket); err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", schemas.PermitsBucket, err)
	}
	return s, nil
}

func (s *directStore) putPermit(ctx context.Context, rec schemas.PermitRecord) error {
	b, _ := json.Marshal(rec)
	_, err := s.permits.Put(ctx, schemas.PermitKey(rec.AgentID, rec.RequestID), b)
	return err
}

func (s *directStore) eventSubject(agent string) string { return schemas.EventSubject(agent) }

func (s *directStore) lastEvents(ctx context.Context, ids []string) (map[string]uint64, error) {
	tails, err := s.tails(ctx, ids)
	if err != nil {
		return nil, err
	}
	return lastOfTails(tails), nil
}

// lastOfTails is each agent's last event number.
func lastOfTails(tails map[string]schemas.Tail) map[string]uint64 {
	last := make(map[string]uint64, len(tails))
	for id, t := range tails {
		last[id] = t.Last
	}
	return last
}

func (s *directStore) tails(ctx context.Context, ids []string) (map[string]schemas.Tail, error) {
	tails := map[string]schemas.Tail{}
	for _, id := range ids {
		t, err := tailOf(ctx, s.nc, s.events, id)
		if err != nil {
			return nil, err
		}
		tails[id] = t
	}
	return tails, nil
}

func (s *directStore) create(ctx context.Context, id string, val []byte) (uint64, error) {
	return s.agents.Create(ctx, id, val)
}

func (s *directStore) update(ctx context.Context, id string, val []byte, rev uint64) (uint64, error) {
	return s.agents.Update(ctx, id, val, rev)
}

func (s *directStore) get(ctx context.Context, id string) (entry, error) {
	e, err := s.agents.Get(ctx, id)
	if err != nil {
		return entry{}, err
	}
	return entry{id: id, rev: e.Revision(), value: e.Value()}, nil
}

// remove forgets a dead agent's record at revision rev: the marker
// carries the record and leaves nothing else of the key, for as long as
// the stream keeps events (client.ForgetRecord).
func (s *directStore) remove(ctx context.Context, id string, rev uint64) error {
	var last []byte
	if e, err := s.agents.Get(ctx, id); err == nil && e.Revision() == rev {
		last = e.Value()
	}
	return client.Forget(ctx, s.js, id, last, rev)
}

func (s *directStore) owned(ctx context.Context) ([]entry, error) {
	lister, err := s.agents.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []entry
	for key := range lister.Keys() {
		e, err := s.get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // gone since it was listed
		}
		if err != nil {
			return nil, err // not a list of all: a record unread may be this node's
		}
		if rec, err := decodeRecord(e.value); err == nil && rec.Node == s.node {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *directStore) hello(ctx context.Context) (schemas.RelayHelloReply, error) {
	st, err := s.nodes.Status(ctx)
	if err != nil {
		return schemas.RelayHelloReply{}, fmt.Errorf("read KV bucket %s: %w", schemas.NodesBucket, err)
	}
	rep := schemas.RelayHelloReply{NodeTTLMS: st.TTL().Milliseconds()}
	if e, err := s.nodes.Get(ctx, s.node); err == nil {
		var rec schemas.NodeRecord
		json.Unmarshal(e.Value(), &rec)
		rep.Instance = rec.Instance
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = s.nc.RequestWithContext(ctx, schemas.ControlSubject(s.node, schemas.VerbList), []byte(`{}`))
	switch {
	case err == nil:
		rep.NameTaken = true
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded):
	default:
		return schemas.RelayHelloReply{}, err
	}
	return rep, nil
}

func (s *directStore) beat(ctx context.Context, rec []byte) error {
	_, err := s.nodes.Put(ctx, s.node, rec)
	return err
}

func (s *directStore) leave(ctx context.Context) error { return s.nodes.Delete(ctx, s.node) }

// relayStore goes through the coordinator's relay, under
// shoal.relay.<node>. Writes come back as JetStream acknowledgements (the
// relay forwards them with the node's reply subject) or as the relay's
// refusal in the same shape.
type relayStore struct {
	nc   *nats.Conn
	node string
}

func (s *relayStore) eventSubject(agent string) string {
	return schemas.RelaySubject(s.node, schemas.RelayEvent, agent)
}

func (s *relayStore) lastEvents(ctx context.Context, ids []string) (map[string]uint64, error) {
	tails, err := s.tails(ctx, ids)
	if err != nil {
		return nil, err
	}
	return lastOfTails(tails), nil
}

// tails asks the relay how each agent's stream ends, at most
// schemas.MaxRelayLast agents a request.
func (s *relayStore) tails(ctx context.Context, ids []string) (map[string]schemas.Tail, error) {
	out := map[string]schemas.Tail{}
	for part := range slices.Chunk(ids, schemas.MaxRelayLast) {
		var rep schemas.RelayLastReply
		if err := s.ask(ctx, schemas.RelayLast, schemas.RelayLastRequest{Agents: part}, &rep); err != nil {
			return nil, err
		}
		if rep.Tails == nil { // a coordinator that only reports numbers
			for id, n := range rep.Last {
				out[id] = schemas.Tail{Last: n}
			}
		}
		maps.Copy(out, rep.Tails)
	}
	return out, nil
}

func (s *relayStore) create(ctx context.Context, id string, val []byte) (uint64, error) {
	rev, err := s.write(ctx, id, val, 0, false)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, jetstream.ErrKeyExists
	}
	return rev, err
}

func (s *relayStore) update(ctx context.Context, id string, val []byte, rev uint64) (uint64, error) {
	return s.write(ctx, id, val, rev, false)
}

func (s *relayStore) remove(ctx context.Context, id string, rev uint64) error {
	_, err := s.write(ctx, id, nil, rev, true)
	return err
}

func (s *relayStore) write(ctx context.Context, id string, val []byte, rev uint64, del bool) (uint64, error) {
	h := nats.Header{}
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if del {
		h.Set("KV-Operation", "DEL")
	}
	return s.publish(ctx, &nats.Msg{Subject: schemas.RelaySubject(s.node, schemas.RelayRecord, id), Header: h, Data: val})
}

// publish sends a write through the relay and reads the acknowledgement.
func (s *relayStore) publish(ctx context.Context, m *nats.Msg) (uint64, error) {
	rep, err := s.request(ctx, m)
	if err != nil {
		return 0, err
	}
	var ack struct {
		Seq   uint64              `json:"seq"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(rep.Data, &ack); err != nil {
		return 0, fmt.Errorf("the relay answered %q: %w", rep.Data, err)
	}
	if ack.Error != nil {
		return 0, ack.Error
	}
	return ack.Seq, nil
}

func (s *relayStore) putPermit(ctx context.Context, rec schemas.PermitRecord) error {
	b, _ := json.Marshal(rec)
	_, err := s.publish(ctx, &nats.Msg{Subject: schemas.RelaySubject(s.node, schemas.RelayPermit, rec.AgentID), Data: b})
	return err
}

func (s *relayStore) get(ctx context.Context, id string) (entry, error) {
	var rep schemas.RelayEntry
	if err := s.ask(ctx, schemas.RelayGet, nil, &rep, id); err != nil {
		return entry{}, err
	}
	if !rep.Found {
		return entry{}, jetstream.ErrKeyNotFound
	}
	return entry{id: id, rev: rep.Revision, value: rep.Value}, nil
}

// owned asks for the node's records a page at a time (a relay of an
// earlier version answers them all, with no next), each page within
// relayOwnedWait.
func (s *relayStore) owned(ctx context.Context) ([]entry, error) {
	var out []entry
	req := schemas.RelayOwnedRequest{Paged: true, Max: s.nc.MaxPayload()}
	for {
		var rep schemas.RelayOwnedReply
		pctx, cancel := context.WithTimeout(ctx, relayOwnedWait)
		err := s.ask(pctx, schemas.RelayOwned, req, &rep)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, e := range rep.Records {
			if rec, err := decodeRecord(e.Value); err == nil {
				out = append(out, entry{id: rec.ID, rev: e.Revision, value: e.Value})
			}
		}
		if rep.Next == "" || rep.Next <= req.After {
			return out, nil
		}
		req.After = rep.Next
	}
}

// relayOwnedWait bounds each page of a relayStore.owned.
const relayOwnedWait = 30 * time.Second

// hello is the node's first word. A node whose connection is new (a leaf
// server that has just joined the hub above all) may ask before the
// relay's subscriptions have reached it: no responders then is not yet an
// answer, and it asks again, for up to helloWait.
func (s *relayStore) hello(ctx context.Context) (schemas.RelayHelloReply, error) {
	var rep schemas.RelayHelloReply
	deadline := time.Now().Add(helloWait)
	for {
		err := s.ask(ctx, schemas.RelayHello, nil, &rep)
		if err == nil {
			return rep, nil
		}
		if schemas.CodeOf(err) != schemas.CodeUnavailable || time.Now().After(deadline) {
			return rep, err
		}
		select {
		case <-ctx.Done():
			return rep, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// helloWait bounds how long a joining node waits for the relay to be
// reachable.
const helloWait = 10 * time.Second

func (s *relayStore) beat(ctx context.Context, rec []byte) error {
	_, err := s.publish(ctx, &nats.Msg{Subject: schemas.RelaySubject(s.node, schemas.RelayBeat), Data: rec})
	return err
}

func (s *relayStore) leave(ctx context.Context) error {
	h := nats.Header{}
	h.Set("KV-Operation", "DEL")
	_, err := s.publish(ctx, &nats.Msg{Subject: schemas.RelaySubject(s.node, schemas.RelayBeat), Header: h})
	return err
}

// ask makes a request of the relay and decodes its JSON reply. Every
// question is a read (the node's budgets, grant, records, streams' ends,
// its hello), so one whose answer is lost (the coordinator that took it
// killed before it answered, a connection cut as the answer went) is asked
// again after relayAskAgain, within ctx: it waited the whole of its
// caller's deadline, and an open's reads most of a minute through a
// coordinator's restart.
func (s *relayStore) ask(ctx context.Context, op schemas.RelayOp, req, rep any, agent ...string) error {
	var body []byte
	if req != nil {
		body, _ = json.Marshal(req)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, relayAskWait)
		defer cancel()
	}
	for {
		actx, cancel := context.WithTimeout(ctx, relayAskAgain)
		m, err := s.request(actx, &nats.Msg{Subject: schemas.RelaySubject(s.node, op, agent...), Data: body})
		again := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if again {
			continue // unanswered (or busy) for relayAskAgain: asked anew
		}
		if err != nil {
			return err
		}
		return schemas.DecodeReply(m.Data, rep)
	}
}

// request asks the relay m and returns its answer. An answer that the
// node's share of the relay's work was full (schemas.HeaderRelayBusy:
// nothing was done) is asked again after a moment, longer each time,
// until ctx ends.
func (s *relayStore) request(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	if _, ok := ctx.Deadline(); !ok {
		// A request or its reply may be lost with a connection (the
		// relay's, cut as the reply left): nothing answers then, and a
		// caller that set no deadline would wait for ever.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, relayAskWait)
		defer cancel()
	}
	wait := 20 * time.Millisecond
	for {
		rep, err := s.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return nil, relayErr(err)
		}
		if rep.Header.Get(schemas.HeaderRelayBusy) == "" {
			return rep, nil
		}
		select {
		case <-ctx.Done():
			return nil, schemas.Errf(schemas.CodeUnavailable, "the relay was busy with this node's other operations: %s", rep.Data)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// relayAskWait bounds a request of the relay whose caller set no deadline.
const relayAskWait = 30 * time.Second

// relayAskAgain is how long a question of the relay waits for its answer
// before it is asked again, within its caller's deadline.
const relayAskAgain = 5 * time.Second

func relayErr(err error) error {
	if errors.Is(err, nats.ErrNoResponders) {
		return schemas.Errf(schemas.CodeUnavailable, "the coordinator's relay is not reachable")
	}
	return err
}

// refused reports whether the relay refused a write for good (an agent
// the node no longer owns): sending it again would change nothing.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == schemas.RelayRefused
}

// tailOf reads how an agent's stream ends.
func tailOf(ctx context.Context, nc *nats.Conn, stream jetstream.Stream, id string) (schemas.Tail, error) {
	t, _, err := client.StreamTail(ctx, nc, stream, id)
	return t, err
}
