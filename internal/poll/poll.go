// Package poll waits in tests for a condition that comes true on its own
// (a process gone, a record written), by polling with a deadline rather
// than sleeping for a guess.
package poll

import (
	"testing"
	"time"
)

// Every is how often Until looks.
const Every = 20 * time.Millisecond

// Until calls cond every Every until it holds, and fails the test, naming
// what it waited for, if it does not within d.
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(Every)
	}
}
