package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
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
//
// With keepalive, the answerer is asked to say every keepalive that it
// still holds the request (schemas.HeaderKeepalive; the fabric service
// does). Once it has said so, a silence of keepaliveLost of them takes it
// for gone (a coordinator killed while the caller's own connection stayed
// up, which nothing else tells): the request is sent again as after a
// loss of the connection, from the last word heard, and a silence longer
// than sentAgainFor ends the wait with errHolderLost. tell, when set, is
// told in a line that the request went again after such a silence.
func requestAcross(ctx context.Context, nc *nats.Conn, subject, reply string, body []byte, notYet func(*nats.Msg) bool, keepalive time.Duration, tell func(string)) (*nats.Msg, error) {
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
	req := &nats.Msg{Subject: subject, Reply: reply, Data: body}
	var (
		heard   time.Time // when the answerer last said it holds the request
		copied  time.Time // when the request was last sent
		tooLong bool      // the caller was away past sentAgainFor since it last heard
		check   <-chan time.Time
	)
	if keepalive > 0 {
		req.Header = nats.Header{schemas.HeaderKeepalive: {strconv.FormatInt(keepalive.Milliseconds(), 10)}}
		t := time.NewTicker(keepalive)
		defer t.Stop()
		check = t.C
	}
	send := func() error {
		copied = time.Now()
		return nc.PublishMsg(req)
	}
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
		case <-check:
			silent := keepaliveLost * keepalive
			if heard.IsZero() || time.Since(heard) < silent || !lost.IsZero() {
				continue // not heard from yet, heard lately, or the connection is away: its return sends it
			}
			if tooLong || time.Since(heard) >= sentAgainFor {
				return nil, errHolderLost
			}
			if time.Since(copied) >= silent {
				if tell != nil {
					tell(fmt.Sprintf("the coordinator holding the request went silent %s ago: sent it again, to whichever coordinator answers (giving up %s after its last word)",
						time.Since(heard).Round(time.Second), sentAgainFor))
				}
				sentAt, backAt, retry = heard, time.Now(), nil
				send()
			}
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
			if !heard.IsZero() {
				// Silence is counted while connected: the answerer's words
				// could not reach a caller away, and it may hold the
				// request still. Past sentAgainFor away, no copy goes for
				// a silence after (it could be a new turn): it ends the wait.
				heard = time.Now()
				tooLong = tooLong || !lost.IsZero() && time.Since(lost) >= sentAgainFor
			}
			lost = time.Time{}
		case <-retry:
			retry = nil
			if time.Since(sentAt) < sentAgainFor {
				send()
			}
		case m := <-replies:
			if keepalive > 0 && m.Header.Get(schemas.HeaderKeepalive) != "" {
				heard = time.Now() // held, not answered
				continue
			}
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
// A variable for tests only.
var sentAgainFor = 90 * time.Second

// keepaliveLost is how many keepalives an answerer that has said it holds
// a request may miss before it is taken for gone; keepaliveEvery is how
// often the fabric service is asked to say so.
const (
	keepaliveLost  = 3
	keepaliveEvery = 5 * time.Second
)

// errHolderLost ends a wait whose answerer went silent (keepalive) and
// whose request no other answerer took up within sentAgainFor.
var errHolderLost = errors.New("the coordinator holding the request went silent, and none took it up since; what the agent did meanwhile is in its stream (shoal output, shoal tail)")

// notWholeFor is how long after the connection came back an answer to a
// copy that finds the fabric not whole yet is asked again.
const notWholeFor = 15 * time.Second
