package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// serverLog adapts the NATS server's logger to slog and remembers the
// first fatal error, which the server reports through its logger rather
// than by returning it.
type serverLog struct {
	log     *slog.Logger
	fatalCh chan error

	mu    sync.Mutex
	first error
	last  string // the last error the server logged
}

func newServerLog(l *slog.Logger) *serverLog {
	return &serverLog{log: l.With("component", "nats-server"), fatalCh: make(chan error, 1)}
}

func (s *serverLog) Noticef(format string, v ...any) {
	s.log.Debug(fmt.Sprintf(format, v...))
}

func (s *serverLog) Warnf(format string, v ...any) {
	s.log.Warn(fmt.Sprintf(format, v...))
}

func (s *serverLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	s.mu.Lock()
	s.last = msg
	s.mu.Unlock()
	s.log.Error(msg)
}

// lastError is the last error the server logged, or "".
func (s *serverLog) lastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Debugf is called only when the server's debug flag is on, which the
// broker never sets.
func (s *serverLog) Debugf(format string, v ...any) {
	s.log.Debug(fmt.Sprintf(format, v...))
}

func (s *serverLog) Tracef(string, ...any) {}

// Fatalf records the error; the embedded server then stops starting.
func (s *serverLog) Fatalf(format string, v ...any) {
	err := errors.New(cleanFatal(fmt.Sprintf(format, v...)))
	s.log.Debug("fatal: " + err.Error()) // Start returns it; logging it too would say it twice
	s.mu.Lock()
	first := s.first == nil
	if first {
		s.first = err
	}
	s.mu.Unlock()
	if first {
		s.fatalCh <- err
	}
}

func (s *serverLog) fatal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// cleanFatal rewrites the server's wording of common start-up failures
// into one line that names the problem.
func cleanFatal(msg string) string {
	if strings.Contains(msg, "address already in use") {
		if i := strings.Index(msg, "port: "); i >= 0 {
			addr, _, _ := strings.Cut(msg[i+len("port: "):], ",")
			return fmt.Sprintf("cannot listen on %s: address already in use", addr)
		}
	}
	return msg
}
