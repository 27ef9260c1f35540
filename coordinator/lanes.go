package coordinator

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// lanes gives each node's events an order of their own: a node's events
// are handled one at a time, in the order they arrive, beside every other
// node's; at most waiting of them (and waitingBytes of their bytes) wait
// for the one handled, and past that the node is answered that it is
// busy. A node's flood of events waits on its own events only.
type lanes struct {
	waiting, waitingBytes int
	handle                func(*nats.Msg)

	mu      sync.Mutex
	nodes   map[string]*lane // only the nodes with events being handled
	stopped bool
	work    sync.WaitGroup
}

// lane is one node's events waiting, behind the one being handled.
type lane struct {
	queue []*nats.Msg
	bytes int
}

func newLanes(waiting, waitingBytes int, handle func(*nats.Msg)) *lanes {
	return &lanes{waiting: waiting, waitingBytes: waitingBytes, handle: handle, nodes: map[string]*lane{}}
}

// laneBytes is what a message counts against its lane's bytes.
func laneBytes(m *nats.Msg) int {
	n := len(m.Subject) + len(m.Reply) + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return n
}

// add hands m to node's lane, to be handled after the node's events
// before it; false when too many wait already (or the relay is stopping),
// and m will not be handled.
func (l *lanes) add(node string, m *nats.Msg) bool {
	size := laneBytes(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	ln := l.nodes[node]
	if ln == nil {
		// Nothing of node's is being handled: m is, now.
		l.nodes[node] = &lane{}
		l.work.Add(1)
		go l.run(node, m)
		return true
	}
	if len(ln.queue) >= l.waiting || ln.bytes+size > l.waitingBytes {
		return false
	}
	ln.queue = append(ln.queue, m)
	ln.bytes += size
	return true
}

// run handles m and then node's events waiting behind it, until none is
// left.
func (l *lanes) run(node string, m *nats.Msg) {
	defer l.work.Done()
	for {
		l.handle(m)
		l.mu.Lock()
		ln := l.nodes[node]
		if len(ln.queue) == 0 {
			delete(l.nodes, node)
			l.mu.Unlock()
			return
		}
		m = ln.queue[0]
		ln.queue[0] = nil
		ln.queue = ln.queue[1:]
		ln.bytes -= laneBytes(m)
		l.mu.Unlock()
	}
}

// stop takes no more events and waits for those being handled and
// waiting (their context ended, they are answered quickly).
func (l *lanes) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.work.Wait()
}

// agentTurns lets one event of each agent at a time be decided, numbered
// and published to the stream. An agent's events come from its owner,
// whose lane keeps their order; but across a reopen on another node, or
// while the relay's view of an owner lags, two nodes' events of one agent
// may be handled at once, and each decision must see the one before it
// done, and reach the stream in the order it was made.
type agentTurns struct {
	mu   sync.Mutex
	held map[string]*agentTurn
}

type agentTurn struct {
	sync.Mutex
	users int
}

// lock waits for agent id's turn.
func (a *agentTurns) lock(id string) {
	a.mu.Lock()
	if a.held == nil {
		a.held = map[string]*agentTurn{}
	}
	t := a.held[id]
	if t == nil {
		t = &agentTurn{}
		a.held[id] = t
	}
	t.users++
	a.mu.Unlock()
	t.Lock()
}

// unlock ends agent id's turn.
func (a *agentTurns) unlock(id string) {
	a.mu.Lock()
	t := a.held[id]
	if t.users--; t.users == 0 {
		delete(a.held, id)
	}
	a.mu.Unlock()
	t.Unlock()
}
