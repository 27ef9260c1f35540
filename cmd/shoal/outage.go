package main

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// outage follows a service's connection to the server: when it was last
// lost and whether it is away now. The relay's is the one the monitor
// asks after, since confined nodes write their heartbeats through it.
type outage struct {
	mu    sync.Mutex
	lost  time.Time
	away  bool
	conns int // connections watched: a second means the first closed
}

// watch follows nc, the service's connection (each one supervise makes
// in turn), and logs its losses and returns.
func (o *outage) watch(nc *nats.Conn, log *slog.Logger) {
	o.mu.Lock()
	o.conns++
	if o.conns > 1 {
		// The connection before this one closed (its loss was noted by
		// its handler); this one is up.
		o.away = false
	}
	o.mu.Unlock()
	name := nc.Opts.Name
	nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
		o.mu.Lock()
		o.lost, o.away = time.Now(), true
		o.mu.Unlock()
		if err != nil {
			log.Warn("a coordinator service's connection was lost; it connects again", "connection", name, "err", err)
		}
	})
	nc.SetReconnectHandler(func(*nats.Conn) {
		o.mu.Lock()
		o.away = false
		o.mu.Unlock()
		log.Info("a coordinator service's connection is back", "connection", name)
	})
}

// state is when the connection was last lost (zero if never) and whether
// it is away now.
func (o *outage) state() (lost time.Time, away bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lost, o.away
}
