package broker

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serveMonitoring serves the server's HTTP monitoring on cfg.Monitor
// itself, rather than letting nats-server open its own listener, for two
// things that listener does not do: it leaves out /debug/vars (Go's
// expvar, which prints the process's command line, where a token given
// as a flag is), and on loopback it answers loopback Host names only, so
// a page whose name it made resolve to 127.0.0.1 (DNS rebinding) cannot
// read it, and it lists no subscription's subject. Every other endpoint
// is nats-server's own handler.
func (b *Broker) serveMonitoring() error {
	host := or(b.cfg.Monitor.Host, b.cfg.Host)
	port := max(b.cfg.Monitor.Port, 0) // -1: any free port
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("monitoring: %w", err)
	}
	s := b.srv
	mux := http.NewServeMux()
	for path, h := range map[string]http.HandlerFunc{
		"/": s.HandleRoot, "/varz": s.HandleVarz, "/connz": s.HandleConnz, "/routez": s.HandleRoutez,
		"/gatewayz": s.HandleGatewayz, "/leafz": s.HandleLeafz, "/subsz": s.HandleSubsz, "/subscriptionsz": s.HandleSubsz,
		"/stacksz": s.HandleStacksz, "/accountz": s.HandleAccountz, "/accstatz": s.HandleAccountStatz,
		"/jsz": s.HandleJsz, "/healthz": s.HandleHealthz, "/ipqueuesz": s.HandleIPQueuesz, "/raftz": s.HandleRaftz,
	} {
		mux.HandleFunc(path, h)
	}
	// No subscription's subject is listed (the subs and test parameters
	// of /connz, /subsz, /routez, /leafz): some of the fabric's are its
	// secrets, such as a replay's flow control, where an answer keeps the
	// replay going; counts are still given.
	var handler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("subs") || q.Has("test") {
			q.Del("subs")
			q.Del("test")
			r.URL.RawQuery = q.Encode()
		}
		mux.ServeHTTP(w, r)
	})
	if isLoopback(host) {
		inner := handler
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !isLoopback(hostOf(r.Host)) {
				http.Error(w, "this monitoring listener answers requests for its loopback address only, not "+r.Host, http.StatusMisdirectedRequest)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	// Each request is read whole in 30 s (a body declared and never sent
	// holds no connection), and an idle connection goes after a minute.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 1 << 20}
	b.monitor = srv
	b.monitorAddr = l.Addr().(*net.TCPAddr)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.log.Error("monitoring stopped", "err", err)
		}
	}()
	return nil
}

// stopMonitoring closes the monitoring listener, if any, and its
// connections.
func (b *Broker) stopMonitoring() {
	if b.monitor != nil {
		b.monitor.Close()
	}
}

// hostOf is a Host header's name, without its port.
func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}
