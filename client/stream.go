package client

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// storedMsg is one message of the stream as a direct read returns it.
type storedMsg struct {
	seq  uint64
	hdr  nats.Header
	data []byte
	time time.Time
}

// walkLimit bounds how many strays a read walks back over before it gives
// up looking for an agent's event.
const walkLimit = 64

// lastMsg is the last message stored on an agent's subject, or nil.
func lastMsg(ctx context.Context, stream jetstream.Stream, id string) (*storedMsg, error) {
	m, err := stream.GetLastMsgForSubject(ctx, schemas.EventSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: %v", id, err)
	}
	return &storedMsg{seq: m.Sequence, hdr: m.Header, data: m.Data, time: m.Time}, nil
}

// msgBefore is the last message stored on an agent's subject before
// stream sequence seq, or nil: a direct read of the last message up to a
// sequence, which JetStream answers without a consumer.
func msgBefore(ctx context.Context, nc *nats.Conn, id string, seq uint64) (*storedMsg, error) {
	if seq <= 1 {
		return nil, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		// A request or its answer lost with a connection (cut as it went)
		// gets no answer: a caller that set no deadline (the relay
		// deciding a node's event) waited for ever, and with it every
		// event of that node. It waits as long as JetStream's own reads.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directReadWait)
		defer cancel()
	}
	body, _ := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		UpToSeq   uint64   `json:"up_to_seq"`
		Batch     int      `json:"batch"`
	}{[]string{schemas.EventSubject(id)}, seq - 1, 1})
	m, err := requestOnce(ctx, nc, &nats.Msg{Subject: "$JS.API.DIRECT.GET." + schemas.StreamName, Reply: nc.NewInbox(), Data: body})
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: the stream did not answer in time", id)
	}
	if err != nil {
		return nil, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: %v", id, err)
	}
	switch status := m.Header.Get("Status"); status {
	case "":
	case "404":
		return nil, nil
	default:
		return nil, schemas.Errf(schemas.CodeUnavailable, "read agent %s's events: %s %s", id, status, m.Header.Get("Description"))
	}
	s := &storedMsg{hdr: m.Header, data: m.Data}
	s.seq, _ = strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	s.time, _ = time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	if s.seq == 0 || s.seq >= seq {
		return nil, schemas.Errf(schemas.CodeInternal, "read agent %s's events: the stream answered sequence %q for a read before %d", id, m.Header.Get(jetstream.SequenceHeader), seq)
	}
	return s, nil
}

// directReadWait bounds a direct read whose caller set no deadline, as
// JetStream's client bounds its API requests.
const directReadWait = 5 * time.Second

// number is the event number a message carries as one of the agent's
// events, or 0 when it is not one by its form: no number of the agent's,
// or not a Kaimon envelope.
func (m *storedMsg) number(id string) uint64 {
	agent, n, err := schemas.ParseMsgID(m.hdr.Get(schemas.HeaderMsgID))
	if err != nil || agent != id {
		return 0
	}
	if _, _, _, err := schemas.Peek(m.data); err != nil {
		return 0
	}
	return n
}

// eventBefore walks back from stream sequence seq to the agent's last
// message that is one of its events by its form, passing over strays.
func eventBefore(ctx context.Context, nc *nats.Conn, id string, seq uint64) (*storedMsg, uint64, error) {
	for range walkLimit {
		m, err := msgBefore(ctx, nc, id, seq)
		if m == nil || err != nil {
			return nil, 0, err
		}
		if n := m.number(id); n > 0 {
			return m, n, nil
		}
		seq = m.seq
	}
	return nil, 0, nil // as if the stream held none: strays only, as far as a reader looks
}

// lastEventBefore is the number of an agent's last event stored before
// stream sequence seq; found is false when the stream holds none.
func lastEventBefore(ctx context.Context, nc *nats.Conn, id string, seq uint64) (uint64, bool, error) {
	m, n, err := eventBefore(ctx, nc, id, seq)
	return n, m != nil, err
}

// StreamTail reads how an agent's stored events end; found is false when
// none is stored. What a stray left at the end (a message without the
// agent's number, one that is not an envelope, a copy of an earlier event,
// a number that does not follow the event before it) is passed over, so a
// node that reopens the agent numbers on from its real last event. The
// node, the coordinator and the clients read it alike.
func StreamTail(ctx context.Context, nc *nats.Conn, stream jetstream.Stream, id string) (schemas.Tail, bool, error) {
	last, err := lastMsg(ctx, stream, id)
	if err != nil {
		return schemas.Tail{}, false, err
	}
	if last == nil {
		return noneStored(ctx, stream)
	}
	n := last.number(id)
	if n == 0 {
		if last, n, err = eventBefore(ctx, nc, id, last.seq); err != nil {
			return schemas.Tail{}, false, err
		} else if last == nil {
			return noneStored(ctx, stream)
		}
	}
	for range walkLimit {
		prev, pn, err := eventBefore(ctx, nc, id, last.seq)
		if err != nil {
			return schemas.Tail{}, false, err
		}
		if prev == nil || n == pn+1 || lostAfter(last.data, pn, n) {
			break
		}
		last, n = prev, pn // a copy, or a number that does not follow
	}
	t, err := schemas.TailOf(last.hdr.Get(schemas.HeaderMsgID), last.data)
	if err != nil {
		return schemas.Tail{}, false, schemas.Errf(schemas.CodeInternal, "agent %s's last event: %v", id, err)
	}
	return t, true, nil
}

// noneStored is the tail of an agent the stream holds no event of: it
// says when the stream's oldest message was stored (Tail.Oldest), where
// the stream says (unknown, a closer takes retention to have dropped
// what the agent's record numbered).
func noneStored(ctx context.Context, stream jetstream.Stream) (schemas.Tail, bool, error) {
	var t schemas.Tail
	if info, err := stream.Info(ctx); err == nil && info.State.Msgs > 0 && !info.State.FirstTime.IsZero() {
		t.Oldest = float64(info.State.FirstTime.UnixNano()) / 1e9
		t.Whole = info.State.FirstSeq == 1
	}
	return t, false, nil
}

// lostAfter reports whether env, numbered n, is the error of a node that
// lost the numbers after prev.
func lostAfter(env []byte, prev, n uint64) bool {
	from, to, ok := schemas.LostRange(env)
	return ok && from <= prev+1 && to == n-1
}
