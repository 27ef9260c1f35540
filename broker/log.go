package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// serverLog adapts the NATS server's logger to slog and remembers the
// first fatal error, which the server reports through its logger rather
// than by returning it.
type serverLog struct {
	log     *slog.Logger
	fatalCh chan error

	mu         sync.Mutex
	first      error
	last       string                       // the last error the server logged
	violations map[string]*violationsLogged // connection -> what was logged of its violations lately
	store      string                       // the JetStream store directory, for what a full disk says
	fullSaid   time.Time                    // when a full store was last said
}

// violationsLogged is what the server's log said of one connection's
// permission violations within a window: any credential, a read-only
// observer's among them, can make the server log a line for each publish
// it may not make, thousands a second.
type violationsLogged struct {
	start      time.Time
	said, held int
}

// A connection has at most violationsPerWindow lines of permission
// violations in the log within violationWindow; the rest are counted, and
// the count logged with its next violation after the window.
const (
	violationsPerWindow = 20
	violationWindow     = time.Minute
)

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
	say, before, hold := s.admit(msg, time.Now())
	s.mu.Unlock()
	if before > 0 {
		s.log.Error("permission violations of a connection were not logged", "connection", violator(msg), "count", before, "within", violationWindow)
	}
	if say {
		s.log.Error(msg)
	}
	if hold {
		s.log.Error("more permission violations of this connection are not logged for a while: it has had its share of lines", "connection", violator(msg), "lines", violationsPerWindow, "within", violationWindow)
	}
	if strings.Contains(msg, "no space left on device") {
		s.mu.Lock()
		say := time.Since(s.fullSaid) >= time.Minute
		if say {
			s.fullSaid = time.Now()
		}
		s.mu.Unlock()
		if say {
			// The server's own line names a file; what it means for the
			// fabric, and that freeing space is not enough, it does not say.
			s.log.Error("the fabric's store is out of disk space: agents' events, records and answers are not stored, and turns, opens and closes fail; free space where it is, then restart shoal up (its store takes no writes again until then; what nodes hold waits in their outboxes)", "store", s.store)
		}
	}
}

// admit says whether msg is logged: any line but a permission violation
// is, and a connection's violations up to their share within the window.
// before is the count of its violations the last window held back; hold
// says this is the first one held back in this window. Called with s.mu
// held.
func (s *serverLog) admit(msg string, now time.Time) (say bool, before int, hold bool) {
	who := violator(msg)
	if who == "" {
		return true, 0, false
	}
	if s.violations == nil {
		s.violations = map[string]*violationsLogged{}
	}
	w := s.violations[who]
	if w == nil || now.Sub(w.start) >= violationWindow {
		if len(s.violations) > 10000 {
			clear(s.violations)
		}
		if w != nil {
			before = w.held
		}
		w = &violationsLogged{start: now}
		s.violations[who] = w
	}
	if w.said < violationsPerWindow {
		w.said++
		return true, before, false
	}
	w.held++
	return false, before, w.held == 1
}

// violator is the connection a permission violation the server logged
// names (its address, id, name and user, as the server writes them), or
// "" when msg is no violation.
func violator(msg string) string {
	for _, v := range []string{" - Publish Violation", " - Subscription Violation"} {
		if who, _, ok := strings.Cut(msg, v); ok {
			return who
		}
	}
	return ""
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
