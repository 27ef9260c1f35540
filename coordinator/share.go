package coordinator

import (
	"sync"
)

// shares gives each node a bounded share of the relay's work: at most
// inFlight of a node's operations run at once, at most waiting more (and
// holding at most waitingBytes of messages) wait for them, in order, and
// past that the node is answered that it is busy.
// A node's flood waits on its own operations only, never on another
// node's: there is no pool the nodes share.
type shares struct {
	inFlight, waiting, waitingBytes int

	mu      sync.Mutex
	nodes   map[string]*share // only the nodes with work running
	stopped bool
	work    sync.WaitGroup
}

// share is one node's operations: those waiting, and how many run.
type share struct {
	queue   []queued
	bytes   int // of the messages waiting
	running int
}

// queued is an operation waiting, and the bytes of its message.
type queued struct {
	job  func()
	size int
}

func newShares(inFlight, waiting, waitingBytes int) *shares {
	return &shares{inFlight: inFlight, waiting: waiting, waitingBytes: waitingBytes, nodes: map[string]*share{}}
}

// do runs job, whose message is size bytes, as one of node's operations,
// now or after the node's operations before it; false when the node has
// too many waiting already (or the relay is stopping), and job will not
// run.
func (s *shares) do(node string, size int, job func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	sh := s.nodes[node]
	if sh == nil {
		sh = &share{}
		s.nodes[node] = sh
	}
	if sh.running < s.inFlight {
		// A goroutine of its own takes job at once: job never waits in
		// the queue, which holds only what waits for a place, however
		// late the goroutine is scheduled.
		sh.running++
		s.work.Add(1)
		go s.run(node, sh, job)
		return true
	}
	if len(sh.queue) >= s.waiting || sh.bytes+size > s.waitingBytes {
		return false
	}
	sh.queue = append(sh.queue, queued{job, size})
	sh.bytes += size
	return true
}

// run runs job, then node's operations waiting until none is left.
func (s *shares) run(node string, sh *share, job func()) {
	defer s.work.Done()
	for {
		job()
		s.mu.Lock()
		if len(sh.queue) == 0 {
			sh.queue = nil
			if sh.running--; sh.running == 0 {
				delete(s.nodes, node)
			}
			s.mu.Unlock()
			return
		}
		next := sh.queue[0]
		sh.queue[0] = queued{}
		sh.queue = sh.queue[1:]
		sh.bytes -= next.size
		s.mu.Unlock()
		job = next.job
	}
}

// stop takes no more work and waits for what runs (its context ended).
func (s *shares) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.work.Wait()
}
