package node

import (
	"strconv"
	"sync"
	"time"
)

// stampTime is t in UTC as time.RFC3339Nano writes it (trailing zeros of
// the fraction dropped), the Shoal-Time header of every event: the
// seconds are formatted once per second, the fraction each time, which
// halves what formatting costs an event.
func stampTime(t time.Time) string {
	t = t.UTC()
	sec := t.Unix()
	stamps.mu.Lock()
	if stamps.sec != sec || stamps.head == "" {
		stamps.sec, stamps.head = sec, t.Truncate(time.Second).Format("2006-01-02T15:04:05")
	}
	head := stamps.head
	stamps.mu.Unlock()
	ns := t.Nanosecond()
	if ns == 0 {
		return head + "Z"
	}
	var b [40]byte
	out := append(b[:0], head...)
	out = append(out, '.')
	frac := strconv.AppendInt(b[len(out):len(out)], int64(ns)+1e9, 10)[1:] // nine digits, zero-padded
	for len(frac) > 0 && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	out = append(out, frac...)
	out = append(out, 'Z')
	return string(out)
}

// stamps is the second stampTime formatted last.
var stamps struct {
	mu   sync.Mutex
	sec  int64
	head string
}
