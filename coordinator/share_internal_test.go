package coordinator

import (
	"runtime"
	"testing"
)

// A node's share takes inFlight operations running and waiting more
// waiting, however late the goroutines running its first operations are
// scheduled: an operation handed to a goroutine not yet started was
// counted as waiting, so a node was answered busy with fewer waiting than
// its share (and, when the goroutines started, one more place opened to
// an operation sent after the busy answer).
func TestShareCountsOnlyWhatWaits(t *testing.T) {
	// One processor: the goroutines do starts run only once this one
	// blocks, as on a loaded machine.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s := newShares(2, 3, 1<<20)
	release := make(chan struct{})
	taken := 0
	for s.do("n1", 0, func() { <-release }) {
		if taken++; taken > 2+3 {
			break
		}
	}
	close(release)
	s.stop()
	if taken != 2+3 {
		t.Fatalf("the share took %d operations before answering busy; want %d running and %d waiting", taken, 2, 3)
	}
}
