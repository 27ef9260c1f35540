package coordinator

import (
	"sync"
)

// shares gives each node a bounded share of the relay's work: at most
// inFlight of a node's operations run at once, at most waiting more wait
// for them, in order, and past that the node is answered that it is busy.
// A node's flood waits on its own operations only, never on another
// node's: there is no pool the nodes share.
type shares struct {
	inFlight, waiting int

	mu      sync.Mutex
	nodes   map[string]*share // only the nodes with work running
	stopped bool
	work    sync.WaitGroup
}

// share is one node's operations: those waiting, and how many run.
type share struct {
	queue   []func()
	running int
}

func newShares(inFlight, waiting int) *shares {
	return &shares{inFlight: inFlight, waiting: waiting, nodes: map[string]*share{}}
}

// do runs job as one of node's operations, now or after the node's
// operations before it; false when the node has too many waiting already
// (or the relay is stopping), and job will not run.
func (s *shares) do(node string, job func()) bool {
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
	if sh.running >= s.inFlight && len(sh.queue) >= s.waiting {
		return false
	}
	sh.queue = append(sh.queue, job)
	if sh.running < s.inFlight {
		sh.running++
		s.work.Add(1)
		go s.run(node, sh)
	}
	return true
}

// run runs node's operations until none waits.
func (s *shares) run(node string, sh *share) {
	defer s.work.Done()
	for {
		s.mu.Lock()
		if len(sh.queue) == 0 {
			sh.queue = nil
			if sh.running--; sh.running == 0 {
				delete(s.nodes, node)
			}
			s.mu.Unlock()
			return
		}
		job := sh.queue[0]
		sh.queue[0] = nil
		sh.queue = sh.queue[1:]
		s.mu.Unlock()
		job()
	}
}

// stop takes no more work and waits for what runs (its context ended).
func (s *shares) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.work.Wait()
}
