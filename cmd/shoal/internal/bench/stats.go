package bench

import (
	"slices"
	"sync"
	"time"
)

// Latency is a distribution of delays, in milliseconds.
type Latency struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
}

// samples collects delays from several goroutines.
type samples struct {
	mu sync.Mutex
	ns []int64
}

func (s *samples) add(d int64) {
	s.mu.Lock()
	s.ns = append(s.ns, d)
	s.mu.Unlock()
}

func (s *samples) addDuration(d time.Duration) { s.add(int64(d)) }

// count is how many samples there are.
func (s *samples) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ns)
}

func (s *samples) latency() Latency {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ns) == 0 {
		return Latency{}
	}
	ns := slices.Clone(s.ns)
	slices.Sort(ns)
	at := func(q float64) float64 {
		i := int(q * float64(len(ns)-1))
		return float64(ns[i]) / 1e6
	}
	return Latency{Samples: len(ns), P50: at(0.50), P99: at(0.99), Max: float64(ns[len(ns)-1]) / 1e6}
}
