package node

import (
	"testing"
	"time"
)

// stampTime writes what time.RFC3339Nano writes, for any instant.
func TestStampTimeIsRFC3339Nano(t *testing.T) {
	base := time.Date(2026, 12, 4, 19, 59, 59, 0, time.UTC)
	for _, d := range []time.Duration{0, 1, 10, 999_999_999, 500 * time.Millisecond, 123_456_789, time.Second, time.Second + 7, 26*time.Hour + 1000} {
		for _, loc := range []*time.Location{time.UTC, time.FixedZone("east", 5*3600+1800)} {
			at := base.Add(d).In(loc)
			if got, want := stampTime(at), at.UTC().Format(time.RFC3339Nano); got != want {
				t.Errorf("stampTime(%v) = %q, want %q", at, got, want)
			}
		}
	}
}

func BenchmarkStampTime(b *testing.B) {
	at := time.Now()
	for b.Loop() {
		stampTime(at)
		at = at.Add(1234)
	}
}
