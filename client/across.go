package client

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// requestAcross sends body to subject, with replies to reply, and waits
// for the first answer. The request carries a request id its owner
// dedupes (or only reads): a request taken by an answerer that then died,
// or a reply sent while the connection was away, is lost (nothing buffers
// it), so when the connection comes back the request is sent again, and
// its owner answers the copy with the reply it made, or, still running,
// once it has made it. Only within sentAgainFor of the connection's loss:
// a node keeps a reply for two minutes from the turn's end, which came
// after the loss (or its reply would have arrived), and past them a copy
// would be a new turn. Once sent again, an answerer not there yet (no
// responders) is asked again every second: it may be reconnecting, or
// starting again. So is one whose answer to a copy notYet finds the
// fabric not whole yet (a coordinator back before the node it asks), for
// notWholeFor. Before any copy, no responders is the caller's to judge.
func requestAcross(ctx context.Context, nc *nats.Conn, subject, reply string, body []byte, notYet func(*nats.Msg) bool) (*nats.Msg, error) {
	status := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	if nc.IsClosed() {
		return nil, nats.ErrConnectionClosed
	}
	replies := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(reply, replies)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	send := func() error { return nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: body}) }
	if err := send(); err != nil {
		return nil, err
	}
	var (
		lost   time.Time // when the connection went, since it was last back
		sentAt time.Time // the loss the request was last sent again after
		backAt time.Time // when the connection came back from it
		retry  <-chan time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case s := <-status:
			if s == nats.CLOSED {
				return nil, nats.ErrConnectionClosed // for good: nothing more can come
			}
			if s != nats.CONNECTED {
				if lost.IsZero() {
					lost = time.Now()
				}
				continue
			}
			if !lost.IsZero() && time.Since(lost) < sentAgainFor {
				sentAt, backAt, retry = lost, time.Now(), nil
				send() // a failure: the connection went again, and says so when back
			}
			lost = time.Time{}
		case <-retry:
			retry = nil
			if time.Since(sentAt) < sentAgainFor {
				send()
			}
		case m := <-replies:
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				if sentAt.IsZero() {
					return nil, nats.ErrNoResponders
				}
				retry = time.After(time.Second)
				continue
			}
			if !sentAt.IsZero() && notYet != nil && time.Since(backAt) < notWholeFor && notYet(m) {
				retry = time.After(time.Second)
				continue
			}
			return m, nil
		}
	}
}

// sentAgainFor is how long after the connection's loss a request is sent
// again: within the two minutes a node keeps a run's reply, with room.
const sentAgainFor = 90 * time.Second

// notWholeFor is how long after the connection came back an answer to a
// copy that finds the fabric not whole yet is asked again.
const notWholeFor = 15 * time.Second
