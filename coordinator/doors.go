package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/shoalfabric/shoal/schemas"
)

// The relay hears each confined node on a door of its own: a connection
// on which only that node's relay subjects arrive. The server cuts a
// connection whose reader falls behind what it is sent (a slow consumer),
// so on one connection for every node a node sending messages of the
// largest size from a few connections had the relay's connection cut
// again and again, and every confined node waited. Through doors a node's
// bytes wait behind its own alone, and a flood cuts only the flooder's
// door. The relay's own connection, on which it writes to the stream and
// buckets and answers the nodes, receives nothing a node sends.
//
// A node's door is opened by its first words, a hello or a heartbeat,
// which come to the lobby: one more connection, on which every node's
// hellos and heartbeats arrive. A hello or heartbeat the lobby takes is
// answered once the node's door is open, so the node's next operation
// finds it. Once the door is open the relay sends the lobby a mark on the
// node's hello subject: whatever the node sent before the door was there
// reaches the lobby before the mark, and the lobby passes over the node's
// hellos and heartbeats after it, which the door has. (Between the door's
// opening and the mark both may take one; a hello answered twice, or a
// heartbeat written twice, changes nothing.) A flood of hellos or
// heartbeats cuts the lobby (and the flooder's door), delaying only nodes
// that have no door yet.
// When the relay starts, every node whose heartbeat was written through a
// relay gets its door at once; a door that hears nothing for doorIdle is
// closed, and the node's next heartbeat opens it again.
type doors struct {
	// dial connects a door (or the lobby) under the connection name it
	// is given; nil: every door is shared, the relay's own connection.
	dial   func(name string) (*nats.Conn, error)
	shared *nats.Conn
	lobby  *nats.Conn      // where each door's mark is sent
	handle nats.MsgHandler // a node's message, as it came
	log    *slog.Logger

	mu     sync.Mutex
	open   map[string]*door
	closed bool
	work   sync.WaitGroup
}

// A door is one node's connection at the relay and its subscription.
type door struct {
	node  string
	nc    *nats.Conn // nil until dialled; the shared one when doors.dial is nil or failed
	own   bool       // nc is the door's own, closed with it
	sub   *nats.Subscription
	done  chan struct{} // closed once it is open, or failed
	err   error         // why it failed; read after done
	heard atomic.Int64  // when it last heard its node, Unix nanoseconds
	mark  string        // the value of its mark (doorMark)
	past  atomic.Bool   // the lobby has taken its mark
}

// doorMark is the header of the mark the relay sends the lobby once a
// node's door is open; its value is the door's own, so a node's hello
// cannot pass for it.
const doorMark = "Shoal-Relay-Door"

// doorPending bounds the bytes a door holds that its node sent and the
// relay has not yet taken: past it the door drops (the node sends again).
// The node's shares of the relay's work bound what is taken.
const doorPending = 64 << 20

// doorIdle is how long a door stays open hearing nothing: a living node
// beats every third of the nodes' TTL.
func doorIdle(ttl time.Duration) time.Duration { return max(3*ttl, time.Minute) }

// doorOpenWait bounds how long a node's hello or heartbeat waits for its
// door to open before it is answered anyway.
const doorOpenWait = 10 * time.Second

// enter opens node's door unless it is open or opening, and returns it.
func (d *doors) enter(node string) *door {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dr := d.open[node]; dr != nil {
		return dr
	}
	dr := &door{node: node, done: make(chan struct{}), mark: nuid.Next()}
	dr.heard.Store(time.Now().UnixNano())
	if d.closed {
		dr.err = fmt.Errorf("the relay is stopping")
		close(dr.done)
		return dr
	}
	d.open[node] = dr
	d.work.Go(func() { d.connect(dr) })
	return dr
}

// connect opens dr: its connection and its subscription, in place at the
// server once it returns.
func (d *doors) connect(dr *door) {
	defer close(dr.done)
	fail := func(err error) {
		dr.err = err
		d.log.Warn("a node's door at the relay did not open; its next hello or heartbeat tries again", "node", dr.node, "err", err)
		d.mu.Lock()
		if d.open[dr.node] == dr {
			delete(d.open, dr.node)
		}
		d.mu.Unlock()
	}
	nc, own := d.shared, false
	if d.dial != nil {
		if c, err := d.dial("shoal-relay-door " + dr.node); err != nil {
			// The server full (it takes so many clients), say: the node
			// is heard on the relay's own connection, as before doors,
			// rather than not at all (its hello and heartbeats would be
			// answered, and it would look alive). The door is dialled
			// again once it is swept and opened anew.
			d.log.Warn("a node's door at the relay could not be dialled; the node is heard on the relay's own connection", "node", dr.node, "err", err)
		} else {
			nc, own = c, true
			nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					d.log.Warn("a node's door at the relay was cut; it connects again", "node", dr.node, "err", err)
				}
			})
			// One that gave up connecting again is forgotten: the node's
			// next hello or heartbeat opens another.
			nc.SetClosedHandler(func(*nats.Conn) {
				d.mu.Lock()
				if d.open[dr.node] == dr {
					delete(d.open, dr.node)
				}
				d.mu.Unlock()
			})
		}
	}
	sub, err := nc.QueueSubscribe(schemas.RelayNamespace(dr.node), relayQueue, func(m *nats.Msg) {
		if m.Header.Get(doorMark) != "" {
			return // for the lobby
		}
		dr.heard.Store(time.Now().UnixNano())
		d.handle(m)
	})
	if err == nil {
		// Bytes counted are bodies only; a message's header is bounded
		// by the count (and, once taken, by the node's shares, which
		// count it).
		sub.SetPendingLimits(2*schemas.MaxEventsAhead, doorPending)
		err = nc.Flush()
	}
	if err != nil {
		if own {
			nc.Close()
		} else if sub != nil {
			sub.Unsubscribe()
		}
		fail(err)
		return
	}
	d.mu.Lock()
	dr.nc, dr.sub, dr.own = nc, sub, own
	d.mu.Unlock()
	mark := nats.NewMsg(schemas.RelaySubject(dr.node, schemas.RelayHello))
	mark.Header.Set(doorMark, dr.mark)
	if err := d.lobby.PublishMsg(mark); err != nil {
		// The lobby goes on taking the node's first words, as the door
		// does: twice, not never.
		d.log.Warn("the relay could not mark a node's door open in its lobby", "node", dr.node, "err", err)
	}
}

// lobby reports whether the lobby is to take m, a hello or heartbeat of
// node, and takes the mark of node's door.
func (d *doors) lobbyTakes(node string, m *nats.Msg) bool {
	d.mu.Lock()
	dr := d.open[node]
	d.mu.Unlock()
	if mark := m.Header.Get(doorMark); mark != "" {
		if dr != nil && mark == dr.mark {
			dr.past.Store(true)
		}
		return false
	}
	return dr == nil || !dr.past.Load()
}

// conn is the connection node is heard on: its door's, or the relay's
// own while it has none open.
func (d *doors) conn(node string) *nats.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dr := d.open[node]; dr != nil && dr.nc != nil {
		return dr.nc
	}
	return d.shared
}

// wait returns once dr is open or has failed, or ctx ends.
func (dr *door) wait(ctx context.Context) {
	select {
	case <-dr.done:
	case <-ctx.Done():
	}
}

// shut closes dr's subscription, and its connection when it is dr's own.
func (dr *door) shut() {
	if dr.sub != nil {
		dr.sub.Unsubscribe()
	}
	if dr.own && dr.nc != nil {
		dr.nc.Close()
	}
}

// sweep closes the open doors that have heard nothing for idle, and
// those heard on the relay's own connection for want of one of their own
// (which the node's next hello or heartbeat dials again).
func (d *doors) sweep(now time.Time, idle time.Duration) {
	var gone []*door
	d.mu.Lock()
	for node, dr := range d.open {
		select {
		case <-dr.done:
		default:
			continue // opening
		}
		if now.Sub(time.Unix(0, dr.heard.Load())) > idle || (d.dial != nil && dr.err == nil && !dr.own) {
			delete(d.open, node)
			gone = append(gone, dr)
		}
	}
	d.mu.Unlock()
	for _, dr := range gone {
		d.log.Info("closed a node's door at the relay, idle", "node", dr.node, "idle", idle)
		dr.shut()
	}
}

// stop closes every door, once those opening are open.
func (d *doors) stop() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.work.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for node, dr := range d.open {
		dr.shut()
		delete(d.open, node)
	}
}
