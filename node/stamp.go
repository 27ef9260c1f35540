package node

import (
	"strconv"
	"sync/atomic"
	"time"
)

// stampTime is t in UTC as time.RFC3339Nano writes it (trailing zeros of
// the fraction dropped), the Shoal-Time header of every event: the
// seconds are formatted once per second, the fraction each time, which
// halves what formatting costs an event.
func stampTime(t time.Time) string {
	t = t.UTC()
	sec := t.Unix()
	last := stamps.Load()
	if last == nil || last.sec != sec {
		last = &stampSecond{sec: sec, head: t.Truncate(time.Second).Format("2006-01-02T15:04:05")}
		stamps.Store(last)
	}
	ns := t.Nanosecond()
	if ns == 0 {
		return last.head + "Z"
	}
	var b [40]byte
	out := append(b[:0], last.head...)
	out = append(out, '.')
	frac := strconv.AppendInt(b[len(out):len(out)], int64(ns)+1e9, 10)[1:] // nine digits, zero-padded
	for len(frac) > 0 && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	out = append(out, frac...)
	out = append(out, 'Z')
	return string(out)
}

// stampSecond is a second as stampTime writes it, up to its fraction.
type stampSecond struct {
	sec  int64
	head string
}

// stamps is the second stampTime formatted last. The agents' loops stamp
// their events at once: each reads it without a lock, and whoever finds
// it stale formats the new second and puts it in its place.
var stamps atomic.Pointer[stampSecond]
